//! Answering a claim that found the key taken: the stored response replayed, or a refusal.

use http::{HeaderValue, Response};

use super::{
    answer::{reject, with_outcome},
    config::Config,
    ResponseBody,
};
use crate::{
    outcome::Outcome,
    problem::Rejection,
    store::{CachedResponse, ClaimOutcome, Fingerprint},
    BODY_OMITTED_HEADER, REPLAYED_HEADER,
};

/// The answer to a claim that found the key completed or in flight: the replay of a completed
/// request with this `fingerprint`, `422` for another request under the key, the in-flight
/// refusal otherwise. `Claimed` is the caller's to run and never reaches here.
pub(super) fn answer<B>(
    config: &Config,
    claim: ClaimOutcome,
    fingerprint: &Fingerprint,
) -> Response<ResponseBody<B>> {
    match claim {
        ClaimOutcome::Completed { record, .. } if record.fingerprint == *fingerprint => {
            match replay(record.response) {
                Some(response) => with_outcome(response, Outcome::Replayed),
                None => {
                    // Only a record built outside the layer (a corrupt or foreign store value)
                    // can be this full; answer as for any unreadable record.
                    tracing::error!(
                        "the stored response has too many headers to replay; answering 503"
                    );
                    let unavailable = Rejection::StoreUnavailable {
                        retry_after: config.retry_after,
                    };
                    reject(unavailable, Outcome::StoreUnavailable)
                }
            }
        }
        ClaimOutcome::InFlight {
            fingerprint: holder,
            lease_remaining,
            ..
        } if holder == *fingerprint => {
            // Never later than the holder's lease ends (the key is free or renewed by then),
            // never later than the configured hint; the header rounds up to at least 1 s.
            let in_flight = Rejection::InFlight {
                status: config.in_flight_status,
                retry_after: config.retry_after.min(lease_remaining),
            };
            reject(in_flight, Outcome::InFlight)
        }
        _ => reject(Rejection::KeyReused, Outcome::Mismatch),
    }
}

/// The stored response with the replay markers; `None` when its header map is too full to take
/// them (`HeaderMap::insert` would panic).
fn replay<B>(cached: CachedResponse) -> Option<Response<ResponseBody<B>>> {
    let mut response = Response::new(ResponseBody::full(cached.body));
    *response.status_mut() = cached.status;
    *response.headers_mut() = cached.headers;
    let headers = response.headers_mut();
    headers
        .try_insert(REPLAYED_HEADER.clone(), HeaderValue::from_static("true"))
        .ok()?;
    if cached.body_omitted {
        headers
            .try_insert(
                BODY_OMITTED_HEADER.clone(),
                HeaderValue::from_static("true"),
            )
            .ok()?;
    }
    Some(response)
}
