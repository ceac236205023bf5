#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tower_idempotency_fuzz::fixtures(data));
