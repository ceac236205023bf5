//! The shared MySQL or MariaDB server of the tests: where it is, and the skip-or-fail rule for
//! it. (The helpers open no connection themselves, so this crate needs no MySQL driver.)

use crate::env::{host_port, reachable, skip};

/// The shared MySQL or MariaDB test database: `MYSQL_URL`, or the local default
/// `mysql://root@127.0.0.1:3306/test`.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// Whether the shared MySQL or MariaDB ([`mysql_url`]) accepts connections; when it does not,
/// the test `what` is skipped ([`skip`]: under `CI=true` that fails it).
pub fn mysql_or_skip(what: &str) -> bool {
    let up = reachable(&host_port(&mysql_url()));
    if !up {
        skip(what, "MySQL/MariaDB is not reachable");
    }
    up
}

/// A table name for one test: `{prefix}_{16 hex digits}`, no other run's.
pub fn mysql_table(prefix: &str) -> String {
    format!("{prefix}_{}", crate::random_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_url_names_the_shared_server() {
        if std::env::var_os("MYSQL_URL").is_none() {
            assert_eq!(host_port(&mysql_url()), "127.0.0.1:3306");
        }
        assert_ne!(mysql_table("t"), mysql_table("t"));
    }
}
