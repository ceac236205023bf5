//! Every provider's fixture, one part of its valid delivery replaced.

use bytes::Bytes;
use tower_idempotency_webhooks::testing;

use crate::{check, now, parts, NOW};

/// Every provider's fixture: a byte choosing the fixture, a byte choosing one header of its
/// valid delivery (or the body), then that part's new bytes. Unchanged, the delivery verifies.
pub fn fixtures(data: &[u8]) {
    let [choice, value] = [
        &data[..data.len().min(2)],
        data.get(2..).unwrap_or_default(),
    ];
    let all = testing::fixtures();
    let fixture = &all[usize::from(choice.first().copied().unwrap_or(0)) % all.len()];
    let event = fixture.event("evt_fuzz", NOW);
    let mut delivery = fixture.sign(&event, NOW);
    let part = usize::from(choice.get(1).copied().unwrap_or(0)) % (delivery.headers.len() + 1);
    let mut body = delivery.body.clone().into_bytes();
    let unchanged = match delivery.headers.get_mut(part) {
        Some((_, header)) => {
            let Ok(text) = std::str::from_utf8(value) else {
                return;
            };
            std::mem::replace(header, text.to_owned()) == text
        }
        None => std::mem::replace(&mut body, value.to_vec()) == value,
    };
    let headers: Vec<(&'static str, &[u8])> = delivery
        .headers
        .iter()
        .map(|(name, value)| (*name, value.as_bytes()))
        .collect();
    let Some(p) = parts(testing::PATH, &headers) else {
        return;
    };
    let result = fixture
        .verifier()
        .verify(&p, &Bytes::from(body.clone()), now());
    check::outcome(&result, &body);
    if unchanged {
        assert!(result.is_ok(), "{}: {result:?}", fixture.provider());
    }
}
