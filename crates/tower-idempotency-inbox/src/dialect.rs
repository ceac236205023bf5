//! [`Db`]: which database a statement of the inbox's own is written for, where its SQL
//! differs, and the MySQL key type. Below the modules that write the inbox's SQL (`backend`,
//! `ordering`, `retention`), which all read it.

use tower_idempotency_jobs::Placeholders;

/// The database a statement is written for, where the inbox's own SQL differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Db {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Sqlite,
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    MySql,
}

impl Db {
    /// How its statements write parameters.
    pub(crate) fn placeholders(self) -> Placeholders {
        match self {
            Self::MySql => Placeholders::Positional,
            Self::Postgres | Self::Sqlite => Placeholders::Numbered,
        }
    }
}

/// MySQL's type of a key column: compared byte by byte (as Postgres's "C" collation does), and
/// short enough for the primary key and the positions table's.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) const MYSQL_KEY: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
