//! The signing schemes several providers share. A scheme is the whole check: read the headers,
//! rebuild the signed bytes, match a secret in constant time, then check the replay window; the
//! provider files choose the names and read the event id.

#[cfg(any(feature = "stripe", feature = "paddle"))]
mod timestamped;
#[cfg(any(feature = "slack", feature = "zoom"))]
mod v0;

#[cfg(all(feature = "fuzzing", any(feature = "stripe", feature = "paddle")))]
pub(crate) use timestamped::kv_pairs;
#[cfg(any(feature = "stripe", feature = "paddle"))]
pub(crate) use timestamped::TimestampedScheme;
#[cfg(any(feature = "slack", feature = "zoom"))]
pub(crate) use v0::V0Scheme;
