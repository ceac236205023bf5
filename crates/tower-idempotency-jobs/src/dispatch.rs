//! [`Dispatcher`]: the streaming worker loop of a job table whose jobs are handed to it as they
//! arrive (the inbox's acknowledgements feed it) as well as found by a sweep. Each job runs as
//! soon as a permit (one of [`Settings::concurrency`](crate::Settings::concurrency)) is free;
//! the keys at hand when permits are free are claimed together; a sweep for due jobs runs at
//! every [`Settings::poll_every`](crate::Settings::poll_every), however busy the feed is, and
//! the swept keys are taken in turn with the fed ones. The drain stops taking work and waits
//! for the running jobs up to its deadline.

use std::{collections::VecDeque, future::Future, sync::Arc, time::Duration};

use futures_util::FutureExt;
use tokio::{
    sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
    time::MissedTickBehavior,
};

/// What a [`Dispatcher`] runs: how it finds due jobs and how it claims and runs a batch.
pub trait Source: Send + 'static {
    /// A job's key.
    type Key: Send + 'static;

    /// Fails the jobs whose attempts are spent, then replaces `swept` with the keys of due
    /// jobs (retries and recovered jobs first); answers whether that batch was full (a
    /// backlog: the dispatcher sweeps again once it is taken).
    fn sweep(&mut self, swept: &mut VecDeque<Self::Key>) -> impl Future<Output = bool> + Send;

    /// Claims the jobs of `batch` and runs the claimed ones, each holding its permit until it
    /// ends (the others' permits are freed at once).
    fn start(
        &self,
        batch: Vec<(Self::Key, OwnedSemaphorePermit)>,
    ) -> impl Future<Output = ()> + Send + 'static;

    /// Called once, when the dispatcher stops taking work (before it waits for the running
    /// jobs): detach the feed.
    fn stopped(&mut self);
}

/// The streaming worker loop over a [`Source`], fed keys through a channel.
pub struct Dispatcher<S: Source> {
    source: S,
    receiver: mpsc::Receiver<S::Key>,
    permits: Arc<Semaphore>,
    poll_every: Duration,
}

impl<S: Source> std::fmt::Debug for Dispatcher<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("free", &self.permits.available_permits())
            .field("poll_every", &self.poll_every)
            .finish_non_exhaustive()
    }
}

impl<S: Source> Dispatcher<S> {
    /// A dispatcher of `source`'s jobs, fed by `receiver`, running up to `concurrency` at once
    /// and sweeping every `poll_every`.
    pub fn new(
        source: S,
        receiver: mpsc::Receiver<S::Key>,
        concurrency: usize,
        poll_every: Duration,
    ) -> Self {
        Self {
            source,
            receiver,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            poll_every,
        }
    }

    /// Runs until `stop` sends a drain's deadline (or is dropped: a deadline of zero); answers
    /// whether the running jobs finished by it (those still running then are aborted).
    pub async fn run(mut self, mut stop: oneshot::Receiver<Duration>) -> bool {
        let mut attempts = JoinSet::new();
        let mut sweep = tokio::time::interval(self.poll_every);
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The due jobs the last sweep found, taken in turn with the feed.
        let mut swept = VecDeque::new();
        let (mut swept_turn, mut sweep_again) = (false, false);
        let deadline = 'dispatch: loop {
            while attempts.try_join_next().is_some() {}
            let permit = tokio::select! {
                biased;
                deadline = &mut stop => break deadline.unwrap_or(Duration::ZERO),
                permit = self.permits.clone().acquire_owned() => permit.expect("never closed"),
            };
            // A sweep runs before the next job is handed out at the tick, however busy the
            // feed is and whatever the last sweep found (a retry that fell due since is found
            // ahead of them), and when the last one found a full batch (a backlog) once its
            // jobs have all been taken: sweeping at every job while they are at hand would scan
            // the backlog for jobs already found.
            let tick = sweep.tick().now_or_never().is_some();
            if tick || (sweep_again && swept.is_empty()) {
                sweep_again = self.source.sweep(&mut swept).await;
            }
            let key = match self.at_hand(&mut swept, &mut swept_turn) {
                Some(key) => key,
                None => loop {
                    tokio::select! {
                        biased;
                        deadline = &mut stop => break 'dispatch deadline.unwrap_or(Duration::ZERO),
                        _ = sweep.tick() => {
                            sweep_again = self.source.sweep(&mut swept).await;
                            if let Some(key) = swept.pop_front() {
                                break key;
                            }
                        }
                        Some(key) = self.receiver.recv() => break key,
                    }
                },
            };
            // As many more as permits are free right now and keys at hand: claimed together,
            // each started at once.
            let mut batch = vec![(key, permit)];
            while let Ok(permit) = self.permits.clone().try_acquire_owned() {
                let Some(key) = self.at_hand(&mut swept, &mut swept_turn) else {
                    break;
                };
                batch.push((key, permit));
            }
            attempts.spawn(self.source.start(batch));
        };
        self.source.stopped();
        let finished = tokio::time::timeout(deadline, async {
            while attempts.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !finished {
            attempts.abort_all();
            while attempts.join_next().await.is_some() {}
        }
        finished
    }

    /// The next key at hand without waiting, taking the swept jobs and the feed in turn.
    fn at_hand(&mut self, swept: &mut VecDeque<S::Key>, swept_turn: &mut bool) -> Option<S::Key> {
        *swept_turn = !*swept_turn;
        if *swept_turn {
            swept.pop_front().or_else(|| self.receiver.try_recv().ok())
        } else {
            self.receiver.try_recv().ok().or_else(|| swept.pop_front())
        }
    }
}
