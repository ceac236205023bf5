//! The part of the SQL stores that is the same on every database: [`SqlStore`] (the claim's
//! order of statements, fencing, purging), written once over a [`Backend`] (what differs);
//! the lanes that keep connections checked out; rows and completions (`record`); the lease
//! rules for claims that waited; the keys a process has seen; database errors; and the
//! transactional mode.

pub(crate) mod backend;
pub(crate) mod error;
pub(crate) mod lanes;
pub(crate) mod recent;
pub(crate) mod record;
mod sql_store;
pub mod transactional;

pub use backend::Backend;
pub use sql_store::SqlStore;
