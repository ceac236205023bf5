//! [`Dispatcher`]: the streaming worker loop of a job table whose jobs are handed to it as they
//! arrive (the inbox's acknowledgements feed it) as well as found by a sweep. Each job starts as
//! soon as a permit (one of the dispatcher's `concurrency`) is free; the keys at hand when
//! permits are free are claimed together, a backlog's at least a quarter of the permits at a
//! time (waiting up to 2 ms for running jobs to free them); a sweep for due jobs runs at
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

/// How long a [`Dispatcher`] waits for running jobs to free permits, to claim a backlog's jobs
/// in batches of a quarter of its permits: about as long as a claim's statement takes.
const GATHER_WAIT: Duration = Duration::from_millis(2);

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
    /// The jobs a backlog's claim gathers ([`gather_more`](Self::gather_more)): a quarter of
    /// the permits, at least 1.
    gather: usize,
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
            gather: (concurrency / 4).max(1),
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
            self.gather_more(&mut batch, &mut swept, &mut swept_turn)
                .await;
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

    /// Grows a backlog's small `batch` to [`gather`](Self::gather) jobs, waiting up to
    /// [`GATHER_WAIT`] for the running jobs to free their permits: a claim's statement costs
    /// about as much for one job as for several, and in a backlog the jobs wait anyway. Only
    /// when the keys at hand fill the batch: a job that arrives alone is claimed at once.
    async fn gather_more(
        &mut self,
        batch: &mut Vec<(S::Key, OwnedSemaphorePermit)>,
        swept: &mut VecDeque<S::Key>,
        swept_turn: &mut bool,
    ) {
        let wanted = self.gather;
        if batch.len() >= wanted || swept.len() + self.receiver.len() < wanted - batch.len() {
            return;
        }
        let until = tokio::time::Instant::now() + GATHER_WAIT;
        while batch.len() < wanted {
            let Ok(permit) =
                tokio::time::timeout_at(until, self.permits.clone().acquire_owned()).await
            else {
                return;
            };
            let Some(key) = self.at_hand(swept, swept_turn) else {
                return;
            };
            batch.push((key, permit.expect("never closed")));
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_util::future::join_all;
    use tokio::{
        sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore},
        time::{Duration, Instant},
    };

    use super::{Dispatcher, Source, GATHER_WAIT};

    /// A backlog of `keys` jobs found by the first sweep; each batch's size is sent to
    /// `batches`, and each job holds its permit until `ends` gives it a permit of its own.
    struct Backlog {
        keys: usize,
        batches: mpsc::UnboundedSender<usize>,
        ends: Arc<Semaphore>,
    }

    impl Source for Backlog {
        type Key = usize;

        async fn sweep(&mut self, swept: &mut std::collections::VecDeque<usize>) -> bool {
            swept.extend(0..std::mem::take(&mut self.keys));
            false
        }

        fn start(
            &self,
            batch: Vec<(usize, OwnedSemaphorePermit)>,
        ) -> impl std::future::Future<Output = ()> + Send + 'static {
            self.batches.send(batch.len()).expect("the test listens");
            let ends = self.ends.clone();
            async move {
                join_all(batch.into_iter().map(|(_, permit)| {
                    let ends = ends.clone();
                    async move {
                        ends.acquire().await.expect("never closed").forget();
                        drop(permit);
                    }
                }))
                .await;
            }
        }

        fn stopped(&mut self) {}
    }

    /// A dispatcher of eight permits over `keys` swept jobs: its batches' sizes, the jobs' ends,
    /// its feed, and its stop.
    fn dispatch(
        keys: usize,
    ) -> (
        mpsc::UnboundedReceiver<usize>,
        Arc<Semaphore>,
        mpsc::Sender<usize>,
        oneshot::Sender<Duration>,
    ) {
        let (batches, sizes) = mpsc::unbounded_channel();
        let ends = Arc::new(Semaphore::new(0));
        let (feed, fed) = mpsc::channel(16);
        let (stop, stopped) = oneshot::channel();
        let backlog = Backlog {
            keys,
            batches,
            ends: ends.clone(),
        };
        let dispatcher = Dispatcher::new(backlog, fed, 8, Duration::from_secs(3600));
        tokio::spawn(dispatcher.run(stopped));
        (sizes, ends, feed, stop)
    }

    /// With a backlog at hand and every permit taken, a job that ends does not start a claim of
    /// one: the dispatcher waits for a second (a quarter of its eight permits) and claims the
    /// two together; when no second ends within [`GATHER_WAIT`], it claims the one.
    #[tokio::test(start_paused = true)]
    async fn a_backlogs_claims_gather_a_quarter_of_the_permits() {
        let (mut sizes, ends, _feed, _stop) = dispatch(40);
        assert_eq!(sizes.recv().await, Some(8), "every permit is free at first");

        ends.add_permits(1);
        // Paused time: this returns once every task is idle, before the gather's wait ends.
        tokio::time::sleep(GATHER_WAIT / 4).await;
        assert!(
            sizes.try_recv().is_err(),
            "a claim of one started while the backlog waited"
        );
        ends.add_permits(1);
        assert_eq!(sizes.recv().await, Some(2));

        ends.add_permits(1);
        let alone = Instant::now();
        assert_eq!(sizes.recv().await, Some(1));
        assert!(alone.elapsed() >= GATHER_WAIT, "{:?}", alone.elapsed());
    }

    /// A job that arrives alone (no backlog at hand) is claimed at once, with free permits or
    /// with one freed.
    #[tokio::test(start_paused = true)]
    async fn a_lone_job_is_claimed_at_once() {
        let (mut sizes, ends, feed, _stop) = dispatch(8);
        assert_eq!(sizes.recv().await, Some(8));
        let start = Instant::now();
        ends.add_permits(1);
        feed.send(100).await.expect("the dispatcher listens");
        assert_eq!(sizes.recv().await, Some(1));
        assert_eq!(start.elapsed(), Duration::ZERO, "it waited to gather");
    }
}
