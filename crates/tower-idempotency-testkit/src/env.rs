//! The test environment: the shared services' addresses, names no other run uses, and the
//! skip-or-fail rule for a service that is not there.

use std::{
    collections::HashSet,
    hash::{BuildHasher, RandomState},
    io::Write,
    net::{TcpStream, ToSocketAddrs},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, SystemTime},
};

/// Whether the tests run under CI (`CI=true`), where every service must be there.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips `what` loudly outside CI and fails it under `CI=true`: a CI run that quietly skipped
/// its Postgres or Redis tests would pass without testing them.
///
/// The note goes to the process's stderr directly, as the test harness captures `eprintln!` of
/// passing tests and a skip must be seen; each `what` and `why` is said once per test binary.
///
/// # Panics
///
/// Under `CI=true`, always.
pub fn skip(what: &str, why: &str) {
    if in_ci() {
        panic!("{what} cannot run under CI=true: {why}");
    }
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let note = format!("SKIPPED {what}: {why}");
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if said.get_or_insert_with(HashSet::new).insert(note.clone()) {
        let _ = writeln!(std::io::stderr(), "{note}");
    }
}

/// The shared test database: `DATABASE_URL`, or the local default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The shared Redis: `REDIS_URL`, or the local default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A random 64-bit value; `RandomState` is seeded from the OS per instance.
pub fn random_u64() -> u64 {
    RandomState::new().hash_one(SystemTime::now())
}

/// The current unix time in seconds, as signed webhook deliveries carry it.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_secs()
}

/// 16 random hex digits, for table names, key prefixes and files no other run uses.
pub fn random_suffix() -> String {
    format!("{:016x}", random_u64())
}

/// `host:port` of a `scheme://[user@]host:port[/db]` URL.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// Whether something accepts connections on `host:port` (within a second).
pub fn reachable(host_port: &str) -> bool {
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

/// Whether the shared Postgres ([`database_url`]) accepts connections; when it does not, the
/// test `what` is skipped ([`skip`]: under `CI=true` that fails it).
pub fn postgres_or_skip(what: &str) -> bool {
    let up = reachable(&host_port(&database_url()));
    if !up {
        skip(what, "Postgres is not reachable");
    }
    up
}

/// Whether `binary` is on the `PATH`.
pub fn which(binary: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {binary}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_drops_scheme_user_and_database() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5432/test"),
            "127.0.0.1:5432"
        );
        assert_eq!(host_port("redis://127.0.0.1:6379"), "127.0.0.1:6379");
        assert_eq!(host_port("localhost:1"), "localhost:1");
    }

    #[test]
    fn suffixes_differ() {
        assert_ne!(random_suffix(), random_suffix());
    }
}
