//! The answers a request's steps give: the response with its [`Outcome`] recorded, or a
//! refusal built from a [`Problem`].

use http::Response;
use tracing::Span;

use super::ResponseBody;
use crate::{outcome::Outcome, problem::Problem};

/// A guarded request's answer: the response, or the inner service's error.
pub(super) type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

/// Marks `response` with its `outcome`: recorded on the span, logged, and kept in the
/// response's extensions (the metrics read it there).
pub(super) fn with_outcome<B>(mut response: Response<B>, outcome: Outcome) -> Response<B> {
    Span::current().record("outcome", outcome.as_str());
    tracing::debug!(outcome = outcome.as_str(), "idempotency outcome");
    response.extensions_mut().insert(outcome);
    response
}

/// A refusal: the problem's response, marked with `outcome`.
pub(super) fn reject<B>(
    problem: impl Into<Problem>,
    outcome: Outcome,
) -> Response<ResponseBody<B>> {
    with_outcome(problem.into().into_response(), outcome)
}

/// The answer to a request that stops before its handler runs; boxed, so that the steps' results
/// stay small on the path that goes on.
pub(super) type Early<B> = Box<Response<ResponseBody<B>>>;
