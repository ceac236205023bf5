//! The public store conformance suite on the standalone Redis at `REDIS_URL`.

mod common;

tower_idempotency_core::store_conformance_tests!(common::standalone_store());
