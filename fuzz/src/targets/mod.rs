//! The target bodies, one module per input grammar.

pub(crate) mod decoders;
pub(crate) mod fixtures;
pub(crate) mod pipeline;
pub(crate) mod signatures;
pub(crate) mod twilio;
