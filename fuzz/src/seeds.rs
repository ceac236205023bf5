//! Valid inputs for each target, so mutation starts from deep paths.

use tower_idempotency_webhooks::{paddle, slack, standard, stripe, testing, twilio};

use crate::{NOW, SECRET, SW_SECRET, TWILIO_BASE};

const JSON: &[u8] = br#"{"id":"evt_1","event_id":"evt_1","type":"x"}"#;

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'\n')
}

pub fn stripe() -> Vec<Vec<u8>> {
    let header = stripe::sign(SECRET, NOW, JSON);
    vec![
        join(&[header.as_bytes(), JSON]),
        join(&[format!("t={NOW},v1=00,v0=ab,v1=zz").as_bytes(), b"{}"]),
    ]
}

pub fn paddle() -> Vec<Vec<u8>> {
    let header = paddle::sign(SECRET, NOW, JSON);
    vec![join(&[header.as_bytes(), JSON])]
}

pub fn standard() -> Vec<Vec<u8>> {
    let key = standard::decode_secret(SW_SECRET).expect("valid");
    let sig = standard::sign(&key, "msg_1", NOW, JSON);
    let ts = NOW.to_string();
    vec![
        join(&[
            format!("v1a,AAAA {sig} v2,xx").as_bytes(),
            b"msg_1",
            ts.as_bytes(),
            JSON,
        ]),
        // Found by libFuzzer: a non-ASCII id (the verifier refuses it as malformed; the
        // harness must not expect a self-signed delivery to pass).
        join(&[b"v1a,x", "{\u{7a0}d".as_bytes(), ts.as_bytes(), JSON]),
    ]
}

pub fn v0() -> Vec<Vec<u8>> {
    let sig = slack::sign(SECRET, NOW, JSON);
    let ts = NOW.to_string();
    vec![join(&[sig.as_bytes(), ts.as_bytes(), JSON])]
}

pub fn decoders() -> Vec<Vec<u8>> {
    vec![
        b"deadBEEF".to_vec(),
        b"g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_vec(),
        b"1614265330".to_vec(),
        b"t=1,v1=ab;h1=cd".to_vec(),
    ]
}

pub fn twilio() -> Vec<Vec<u8>> {
    let body = b"CallSid=CA1&CallStatus=ringing&From=%2B1555&Body=a+b%26c";
    let sig = twilio::sign(
        SECRET,
        &format!("{TWILIO_BASE}/sms?x=1"),
        &[
            ("Body", "a b&c"),
            ("CallSid", "CA1"),
            ("CallStatus", "ringing"),
            ("From", "+1555"),
        ],
    );
    vec![
        join(&[b"/sms?x=1", sig.as_bytes(), &[1], body]),
        join(&[b"/j?bodySHA256=00", b"AAAA", &[2], JSON]),
    ]
}

/// Each fixture's valid delivery, each part unchanged.
pub fn fixtures() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for (i, fixture) in testing::fixtures().iter().enumerate() {
        let delivery = fixture.sign(&fixture.event("evt_fuzz", NOW), NOW);
        let parts = delivery.headers.iter().map(|(_, v)| v.as_bytes());
        for (part, value) in parts.chain([delivery.body.as_bytes()]).enumerate() {
            seeds.push([&[i as u8, part as u8][..], value].concat());
        }
    }
    seeds
}

pub fn idempotency_key() -> Vec<Vec<u8>> {
    vec![
        b"8e03978e-40d5-43e8-bc93-6894a57f9326".to_vec(),
        b"\"quoted\";param=1".to_vec(),
        b"\"esc\\\"aped\"".to_vec(),
    ]
}

pub fn pipeline() -> Vec<Vec<u8>> {
    vec![
        [
            &[0u8, 0][..],
            b"/orders\nidempotency-key: k1\ncontent-type: application/json\n\n{\"a\":1}",
        ]
        .concat(),
        [
            &[0u8, 0][..],
            b"/orders\nidempotency-key: \"k1\"\n\n{\"a\":2}",
        ]
        .concat(),
        [
            &[0x81u8, 0][..],
            b"/stripe\ncontent-type: application/json\n\n{\"id\":\"evt_9\"}",
        ]
        .concat(),
        [&[0x82u8, 0][..], b"/gh\nx-github-delivery: d-1\n\n{}"].concat(),
        [
            &[0x83u8, 0][..],
            b"/tw?a=1\ni-twilio-idempotency-token: t1\n\nCallSid=CA1",
        ]
        .concat(),
    ]
}
