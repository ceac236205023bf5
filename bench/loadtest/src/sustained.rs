//! Fresh keys for a long window (`--sustained-ms`, 10 s by default) against the memory stores
//! with the capacity a user gets by default, at the run's highest concurrency: does a store
//! refuse new keys (`503`) once it fills, and what does it sustain meanwhile.

use serde::{Deserialize, Serialize};

use crate::{
    load::{drive, Keys, LoadError, LoadResult, Plan, Stop},
    peer::PeerStore,
    setup::{body, Backends, Runtimes, Target},
    throughput::launch,
    Args, Result,
};

/// One sustained run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SustainedRow {
    /// The target.
    pub target: String,
    /// Workers.
    pub concurrency: usize,
    /// The window, ms.
    pub duration_ms: u64,
    /// What the generator measured (empty when answers other than `201` stopped the run).
    pub result: LoadResult,
    /// Requests sent, warm-up included.
    pub total_requests: u64,
    /// Answers other than `201`, a replay or `409` (a full store answers `503`).
    pub refused: u64,
}

/// The sustained run of every memory target among `targets`.
pub(crate) fn measure(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    targets: &[Target],
) -> Result<Vec<SustainedRow>> {
    let concurrency = args.concurrency.iter().copied().max().unwrap_or(32);
    let mut rows = Vec::new();
    for target in targets.iter().filter(|t| {
        matches!(
            t,
            Target::Bare | Target::Memory | Target::Peer(PeerStore::Memory)
        )
    }) {
        let server = launch(rts, b, target, &b.redis_url)?;
        let outcome = rts.client.block_on(drive(Plan {
            targets: vec![server.addr()],
            run: format!("{}-sustained-{}", b.run, target.name()),
            keys: Keys::Unique,
            body: body(1024),
            concurrency,
            stop: Stop::Timed {
                warmup: std::time::Duration::ZERO,
                measure: args.sustained,
            },
        }));
        drop(server);
        let (result, total_requests, refused) = match outcome {
            Ok(result) => (result.clone(), result.total_requests, 0),
            Err(LoadError::Unexpected {
                other_status,
                errors,
                total,
                ..
            }) => (LoadResult::default(), total, other_status + errors),
            Err(other) => return Err(other.into()),
        };
        eprintln!(
            "  sustained {:>18} c={concurrency} {:>9.0} req/s, {total_requests} requests, {refused} refused",
            target.name(),
            result.rps
        );
        rows.push(SustainedRow {
            target: target.name().into(),
            concurrency,
            duration_ms: args.sustained.as_millis() as u64,
            result,
            total_requests,
            refused,
        });
    }
    Ok(rows)
}
