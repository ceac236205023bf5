//! Mapping database errors to the store errors the layer acts on, without leaking row contents.

use tower_idempotency_core::StoreError;

/// Maps a database error to the store error the layer acts on. `size` is the size of the record
/// being written, when the failing statement wrote one.
pub(crate) fn map_error(error: sqlx::Error, size: Option<usize>, limit: usize) -> StoreError {
    match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(Box::new(error)),
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(number) = mysql_number(&**db) {
                return map_mysql(number, db.message(), size, limit);
            }
            let code = db.code();
            map_code(
                code.as_deref().unwrap_or_default(),
                db.message(),
                size,
                limit,
            )
        }
        _ => StoreError::Backend(Box::new(error)),
    }
}

/// MySQL's error number, when `db` is a MySQL or MariaDB error. Its SQLSTATE says too little:
/// `HY000` covers a lock wait timeout and most other errors alike.
#[cfg(feature = "mysql")]
fn mysql_number(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|db| db.number())
}

/// A MySQL error number and message as the store error the layer acts on.
#[cfg(feature = "mysql")]
fn map_mysql(number: u16, message: &str, size: Option<usize>, limit: usize) -> StoreError {
    if mysql_too_big(number) {
        return StoreError::RecordTooLarge {
            size: size.unwrap_or(0),
            limit,
        };
    }
    let sanitized = Box::new(DatabaseError {
        code: format!("MySQL {number}"),
        message: message.to_owned(),
    });
    if mysql_unavailable(number) {
        StoreError::Unavailable(sanitized)
    } else {
        StoreError::Backend(sanitized)
    }
}

/// MySQL and MariaDB: 1153 ER_NET_PACKET_TOO_LARGE (a record over `max_allowed_packet`) and
/// 1301 ER_WARN_ALLOWED_PACKET_OVERFLOWED.
#[cfg(feature = "mysql")]
fn mysql_too_big(number: u16) -> bool {
    matches!(number, 1153 | 1301)
}

/// MySQL and MariaDB error numbers that say the server cannot serve statements now: 1040 too
/// many connections, 1053 server shutdown, 1158..=1161 network read/write errors and timeouts,
/// 1203 and 1226 a user's connection limits, 1205 lock wait timeout
/// (`innodb_lock_wait_timeout`), 1213 deadlock (the transaction was rolled back), 1290
/// `--read-only` (a server that is being failed over), 1317 query interrupted, 1927 connection
/// killed (MariaDB), 1969 `max_statement_time` exceeded (MariaDB), 3024 `max_execution_time`
/// exceeded (MySQL), 4031 disconnected for inactivity (MySQL).
#[cfg(feature = "mysql")]
fn mysql_unavailable(number: u16) -> bool {
    matches!(
        number,
        1040 | 1053 | 1158
            ..=1161 | 1203 | 1205 | 1213 | 1226 | 1290 | 1317 | 1927 | 1969 | 3024 | 4031
    )
}

/// A database's error code and message as the store error the layer acts on.
pub(crate) fn map_code(code: &str, message: &str, size: Option<usize>, limit: usize) -> StoreError {
    if is_too_big(code) {
        return StoreError::RecordTooLarge {
            size: size.unwrap_or(0),
            limit,
        };
    }
    let sanitized = Box::new(DatabaseError {
        code: code.to_owned(),
        message: message.to_owned(),
    });
    if is_unavailable(code) {
        StoreError::Unavailable(sanitized)
    } else {
        StoreError::Backend(sanitized)
    }
}

/// A database error reduced to its code and primary message. The driver's error also carries
/// the server's detail fields, which can quote the failing row (keys, cached bodies); those must
/// not reach logs through `Debug`.
#[derive(Debug, thiserror::Error)]
#[error("database error {code}: {message}")]
struct DatabaseError {
    code: String,
    message: String,
}

/// SQLite's (extended) result code, when `code` is one. Postgres SQLSTATEs are always five
/// characters, some all digits (42501), so they must not be read as SQLite codes, which have at
/// most four digits.
fn sqlite_code(code: &str) -> Option<i32> {
    if code.len() < 5 {
        code.parse().ok()
    } else {
        None
    }
}

fn is_too_big(code: &str) -> bool {
    // Postgres 54000 program_limit_exceeded (e.g. a value over 1 GB); SQLite SQLITE_TOOBIG (18).
    code == "54000" || sqlite_code(code).is_some_and(|c| c & 0xff == 18)
}

/// Whether `error` says that the database cannot serve statements now (a connection that failed
/// or could not be had, a lock or busy wait that timed out, a deadlock victim on MySQL, a server
/// shutting down or read-only while it is failed over), rather than
/// that it refused this one statement (a constraint, a value it cannot store). A caller retries
/// the first kind later as a whole; the second kind fails only the statement's own row.
pub fn is_unavailable_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(number) = mysql_number(&**db) {
                return mysql_unavailable(number);
            }
            db.code().is_some_and(|code| is_unavailable(&code))
        }
        _ => false,
    }
}

fn is_unavailable(code: &str) -> bool {
    // Postgres class 08 (connection exception), 57P01..57P03 (shutdown, cannot connect now),
    // 53300 too many connections, 55P03 lock_not_available (a `lock_timeout` passed) and 57014
    // query_canceled (a `statement_timeout` passed); SQLite SQLITE_BUSY (5) and SQLITE_LOCKED (6)
    // after the busy timeout, and SQLITE_CANTOPEN (14).
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "53300" | "55P03" | "57014"
        )
        || sqlite_code(code).is_some_and(|c| matches!(c & 0xff, 5 | 6 | 14))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_codes_are_never_read_as_sqlite_codes() {
        // 42501 insufficient_privilege: 42501 & 0xff == 5 (SQLITE_BUSY) if read as a number.
        for code in ["42501", "22021", "22022", "22030", "22034"] {
            assert!(!is_unavailable(code), "{code}");
            assert!(!is_too_big(code), "{code}");
        }
        assert!(is_unavailable("5") && is_unavailable("517") && is_unavailable("08006"));
        assert!(is_unavailable("55P03") && is_unavailable("57014"));
        assert!(is_unavailable_error(&sqlx::Error::PoolTimedOut));
        assert!(!is_unavailable_error(&sqlx::Error::RowNotFound));
        assert!(is_too_big("18") && is_too_big("54000"));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_numbers() {
        for number in [1040, 1053, 1159, 1205, 1213, 1290, 1969, 3024] {
            assert!(mysql_unavailable(number), "{number}");
            assert!(matches!(
                map_mysql(number, "m", None, 1),
                StoreError::Unavailable(_)
            ));
        }
        // 1062 duplicate entry, 1406 data too long, 1146 no such table, 1064 syntax.
        for number in [1062, 1406, 1146, 1064] {
            assert!(!mysql_unavailable(number), "{number}");
            assert!(matches!(
                map_mysql(number, "m", None, 1),
                StoreError::Backend(_)
            ));
        }
        assert!(matches!(
            map_mysql(1153, "m", Some(5), 1),
            StoreError::RecordTooLarge { size: 5, limit: 1 }
        ));
    }
}
