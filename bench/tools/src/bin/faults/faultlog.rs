//! The fault log: every fault with its time since the start, printed as it happens and kept
//! for the summary and for the report around a violation.

use std::{collections::BTreeMap, sync::Mutex, time::Instant};

#[derive(Clone, Debug, serde::Serialize)]
pub struct Entry {
    /// Seconds since the run began.
    pub at: f64,
    pub kind: String,
    pub detail: String,
}

pub struct FaultLog {
    start: Instant,
    entries: Mutex<Vec<Entry>>,
}

impl FaultLog {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            entries: Mutex::default(),
        }
    }

    /// Seconds since the run began.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Logs a fault (`kind` counts in the summary) or a run event (`kind` starting with `-`).
    pub fn log(&self, kind: &str, detail: impl Into<String>) {
        let entry = Entry {
            at: self.now(),
            kind: kind.to_owned(),
            detail: detail.into(),
        };
        println!("[{:>8.3}s] {:<24} {}", entry.at, entry.kind, entry.detail);
        self.entries.lock().unwrap().push(entry);
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().clone()
    }

    /// Faults per kind (run events, whose kind starts with `-`, left out).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for entry in self.entries.lock().unwrap().iter() {
            if !entry.kind.starts_with('-') {
                *counts.entry(entry.kind.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// The entries between `from` and `to` seconds.
    pub fn between(&self, from: f64, to: f64) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.at >= from && e.at <= to)
            .cloned()
            .collect()
    }
}
