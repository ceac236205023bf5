pub use tower_idempotency_core::*;
