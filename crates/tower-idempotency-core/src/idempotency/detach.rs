//! Runs the handler on the caller's task, and moves it to a task of its own only if the caller
//! goes away first.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::runtime::Handle;
use tracing::{Instrument, Span};

/// A future polled in place while its caller waits for it; dropped unfinished (the client
/// disconnected, a timeout layer gave up), it is spawned on the runtime it started on, inside
/// `span` (which its caller polled it in), so a claimed handler is never cancelled halfway and
/// its result is still recorded.
///
/// Spawning every handler up front gives the same guarantee, but costs a task allocation, a
/// scheduler round and a cross-task wake-up on every request, the largest fixed cost of a first
/// request (the load harness in `bench/loadtest` shows it). Only requests whose caller gives up
/// pay it here.
pub(crate) struct DetachOnDrop<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    future: Option<F>,
    runtime: Option<Handle>,
    span: Span,
}

impl<F> DetachOnDrop<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    /// `future` is `Unpin` (boxed by the caller where needed) so that it can be moved into a
    /// task of its own after it has been polled. `span` is the span it is polled in, for the
    /// task's polls.
    pub(crate) fn new(future: F, span: Span) -> Self {
        Self {
            future: Some(future),
            runtime: Handle::try_current().ok(),
            span,
        }
    }
}

impl<F> Future for DetachOnDrop<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self
            .future
            .as_mut()
            .expect("DetachOnDrop polled after completion");
        let output = std::task::ready!(Pin::new(future).poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<F> Drop for DetachOnDrop<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        match &self.runtime {
            Some(runtime) => {
                runtime.spawn(future.instrument(self.span.clone()));
            }
            // Not reachable through the layer (it is always polled inside a runtime); the lease
            // frees the key if it ever happens.
            None => tracing::error!("caller dropped a running handler outside a Tokio runtime; the key stays in flight until its lease expires"),
        }
    }
}
