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
/// or could not be had, a lock or busy wait that timed out, a server shutting down), rather than
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
        sqlx::Error::Database(db) => db.code().is_some_and(|code| is_unavailable(&code)),
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
}
