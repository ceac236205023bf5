//! Reading what a [`DebuggingRecorder`](metrics_util::debugging::DebuggingRecorder) recorded.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// A metric's name and its labels, sorted: one metric has one id whatever order its labels were
/// given in.
pub type MetricId = (String, Vec<(String, String)>);

/// The [`MetricId`] of the metric `name` with `labels`.
pub fn metric_id(name: &str, labels: &[(&str, &str)]) -> MetricId {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort_unstable();
    (name.to_owned(), labels)
}

/// A snapshot of `snapshotter`, each value under its metric's [`MetricId`]. A snapshot drains
/// what it reads (counters and gauges are swapped to zero, histograms cleared), so a test that
/// takes several sums them.
pub fn snapshot(snapshotter: &Snapshotter) -> Vec<(MetricId, DebugValue)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            (metric_id(key.name(), &labels), value)
        })
        .collect()
}
