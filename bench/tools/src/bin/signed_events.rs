//! Signed Stripe deliveries for `bench/scripts/receiver-inbox.sh`: prints `COUNT` lines, each a
//! `Stripe-Signature` header value, a tab, and a new event's JSON body (ids `PREFIX_0`, ...),
//! signed now with `SECRET`. The wrk script `bench/scripts/wrk/stripe.lua` sends them in turn.
//!
//! ```text
//! cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin signed_events -- whsec_bench 200000 evt_run1 > events.tsv
//! ```

use std::{
    io::{BufWriter, Write},
    process::ExitCode,
    time::{SystemTime, UNIX_EPOCH},
};

use hmac::{Hmac, Mac};
use sha2::Sha256;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [secret, count, prefix] = args.as_slice() else {
        eprintln!("usage: signed_events SECRET COUNT PREFIX");
        return ExitCode::from(2);
    };
    let Ok(count) = count.parse::<usize>() else {
        eprintln!("COUNT must be a whole number");
        return ExitCode::from(2);
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or_default();
    let mut out = BufWriter::new(std::io::stdout().lock());
    for i in 0..count {
        let body = format!(
            r#"{{"id":"{prefix}_{i}","object":"event","type":"charge.succeeded","data":{{"object":{{"id":"ch_{i}"}}}}}}"#
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
        mac.update(format!("{now}.{body}").as_bytes());
        let signature = format!("t={now},v1={}", hex::encode(mac.finalize().into_bytes()));
        if writeln!(out, "{signature}\t{body}").is_err() {
            return ExitCode::FAILURE;
        }
    }
    if out.flush().is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
