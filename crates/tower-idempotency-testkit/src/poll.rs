//! Waiting for a condition that a test can only observe by asking again.

use std::{fmt::Debug, future::Future, time::Duration};

use tokio::time::Instant;

/// How long [`poll_until`] keeps asking.
pub const POLL_WITHIN: Duration = Duration::from_secs(20);

/// Asks `probe` every `every` until `done` holds for its answer, and answers that answer: for
/// state a test can only read (a database row, a child process's route, a browser's page).
///
/// # Panics
///
/// After [`POLL_WITHIN`], naming `what` and the last answer.
pub async fn poll_until<T, F>(
    what: &str,
    every: Duration,
    mut probe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T
where
    T: Debug,
    F: Future<Output = T>,
{
    let deadline = Instant::now() + POLL_WITHIN;
    loop {
        let answer = probe().await;
        if done(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never held; last: {answer:?}"
        );
        tokio::time::sleep(every).await;
    }
}
