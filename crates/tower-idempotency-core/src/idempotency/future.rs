use std::{future::Future, pin::Pin};

/// The future returned by [`IdempotencyService`](super::IdempotencyService).
///
/// Boxed because it spans several awaits (body, store, handler) whose types are not
/// nameable; one allocation per request, small beside the body buffer.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;
