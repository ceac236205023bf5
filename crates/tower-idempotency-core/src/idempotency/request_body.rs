//! Reading the request body within the layer's cap (and the response body within the cache's),
//! and discarding what is over it.

use std::{pin::pin, sync::Arc};

use bytes::{Bytes, BytesMut};
use http::{header, request::Parts, Request};
use http_body::Body;
use http_body_util::BodyExt;

use super::{
    answer::{reject, Early},
    config::Config,
};
use crate::{outcome::Outcome, problem::Rejection};

/// The request's head and whole body, or the `413` (or `400` for a body that failed) to answer.
/// A body declared over the cap is refused before it is read.
pub(super) async fn read_request<ReqBody, B>(
    config: &Arc<Config>,
    request: Request<ReqBody>,
) -> Result<(Parts, Bytes), Early<B>>
where
    ReqBody: Body<Data = Bytes> + Send + 'static,
{
    let too_large = Rejection::PayloadTooLarge {
        limit: config.max_body,
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > config.max_body as u64) {
        // A client waiting for `100 Continue` has not sent the body; it never gets the go-ahead.
        // Any other is answered at once, and the body it is sending is discarded beside that.
        if !expects_continue(request.headers()) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let body = Box::pin(request.into_body());
                let config = config.clone();
                runtime.spawn(async move { discard(body, &config).await });
            }
        }
        return Err(Box::new(reject(too_large, Outcome::Rejected)));
    }
    let (parts, body) = request.into_parts();
    match read_body(pin!(body), config.max_body).await {
        // Request trailers are not part of the fingerprint or the request the handler gets.
        Capped::Whole(bytes, _trailers) => Ok((parts, bytes)),
        Capped::Over(_, rest) => {
            discard(rest, config).await;
            Err(Box::new(reject(too_large, Outcome::Rejected)))
        }
        Capped::Failed => Err(Box::new(reject(
            Rejection::BodyUnreadable,
            Outcome::Rejected,
        ))),
    }
}

fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads and drops the rest of a request body over the cap, up to the configured bytes and
/// time, so that a client which uploads everything before reading receives the `413` rather
/// than a connection reset (see `IdempotencyLayer::discard_oversized_body`).
async fn discard<B>(mut body: B, config: &Config)
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut left = config.discard_bytes;
    let drain = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                match left.checked_sub(data.len()) {
                    Some(rest) => left = rest,
                    None => return,
                }
            }
        }
    };
    let _ = tokio::time::timeout(config.discard_time, drain).await;
}

pub(super) enum Capped<B> {
    /// The whole body, and its trailers if it had any.
    Whole(Bytes, Option<http::HeaderMap>),
    Over(Bytes, B),
    Failed,
}

/// Reads a body until it ends (then `Whole`, with its trailers) or exceeds `cap` (then `Over`
/// with what was read and the rest of the body). A single-frame body (the common case) is kept
/// as it is, without a copy and without the frame queue that `http_body_util`'s `collect`
/// allocates per request.
pub(super) async fn read_body<B>(mut body: B, cap: usize) -> Capped<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut len = 0usize;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Capped::Failed;
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(map) = frame.into_trailers() {
                    trailers = Some(map);
                }
                continue;
            }
        };
        len += data.len();
        match first.take() {
            None if rest.is_empty() => first = Some(data),
            previous => {
                if let Some(previous) = previous {
                    rest.extend_from_slice(&previous);
                }
                rest.extend_from_slice(&data);
            }
        }
        if len > cap {
            let prefix = first.take().unwrap_or_else(|| rest.split().freeze());
            return Capped::Over(prefix, body);
        }
    }
    Capped::Whole(first.unwrap_or_else(|| rest.freeze()), trailers)
}
