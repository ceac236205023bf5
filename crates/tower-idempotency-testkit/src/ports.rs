//! Ports for the servers tests start, handed out once.
//!
//! The rule every server a test starts follows: **nothing picks a port, lets it go, and binds it
//! later**, because between the two another server (a node of the same cluster, a proxy, a
//! parallel test) may be handed the same port.
//!
//! - A server in the test process binds `127.0.0.1:0` itself and reports the port it got
//!   ([`serve`](crate::serve), [`Server`](crate::Server), [`Proxy`](crate::Proxy)).
//! - A child process that can do the same binds port 0 and prints its address (the reference
//!   receiver with `RECEIVER_ADDR=127.0.0.1:0`).
//! - A child process that cannot (`redis-server`: `--port 0` turns TCP off) listens on a
//!   [`ReservedPort`]: a port below the kernel's ephemeral range, so that no port-0 bind and no
//!   outgoing connection is given it, locked by a file lock that every test process honours for
//!   as long as the reservation lives (through a kill and a restart of its server). A program
//!   outside the tests may still hold the port: a server whose bind fails says so apart from
//!   "not installed" or "did not start", and is started again on another reserved port
//!   ([`RedisServer`](crate::RedisServer)).

use std::{fs::File, net::TcpListener, path::PathBuf};

use crate::env::random_u64;

/// How many ports a reservation tries before it gives up.
const ATTEMPTS: u32 = 1_000;

/// A loopback port reserved for one server, outside the ephemeral range and locked against every
/// other test process's reservations until dropped.
#[derive(Debug)]
pub struct ReservedPort {
    port: u16,
    // Held for the lock: the OS releases it when the file closes (on drop, or when the process
    // dies however it dies).
    _lock: File,
}

impl ReservedPort {
    /// Reserves a port that no other reservation holds and nothing listens on right now.
    ///
    /// # Panics
    ///
    /// When no port in the range can be reserved.
    pub fn new() -> Self {
        let dir = lock_dir();
        std::fs::create_dir_all(&dir).expect("the port lock directory");
        let (low, high) = reservable_range();
        for _ in 0..ATTEMPTS {
            let port = low + (random_u64() % u64::from(high - low)) as u16;
            let Ok(lock) = File::create(dir.join(port.to_string())) else {
                continue;
            };
            if lock.try_lock().is_err() {
                continue; // another test's server has it
            }
            // Held by something that is not a test of ours: try another.
            if TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            return Self { port, _lock: lock };
        }
        panic!("no loopback port in {low}..{high} could be reserved");
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Default for ReservedPort {
    fn default() -> Self {
        Self::new()
    }
}

/// Where the lock files live: one directory for every test process on the machine.
fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("tower-idempotency-test-ports")
}

/// The ports a reservation picks from: 10 000 ports just below the ephemeral range (or above it,
/// where it starts too low), so that the kernel never hands one to a port-0 bind or an outgoing
/// connection.
fn reservable_range() -> (u16, u16) {
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u16>);
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        // Linux's default range.
        .unwrap_or((32_768, 60_999));
    if low >= 11_024 {
        (low - 10_000, low)
    } else {
        (high.saturating_add(1).max(1_024), u16::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_distinct_while_held_and_outside_the_ephemeral_range() {
        let (low, high) = reservable_range();
        let held: Vec<ReservedPort> = (0..50).map(|_| ReservedPort::new()).collect();
        let mut ports: Vec<u16> = held.iter().map(ReservedPort::port).collect();
        assert!(ports.iter().all(|p| (low..high).contains(p)), "{ports:?}");
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), held.len(), "a port was reserved twice");
    }

    #[test]
    fn a_held_port_is_not_reserved_again_until_dropped() {
        let first = ReservedPort::new();
        let lock = File::create(lock_dir().join(first.port().to_string())).unwrap();
        assert!(lock.try_lock().is_err(), "the reservation holds its lock");
        drop(first);
        assert!(lock.try_lock().is_ok(), "dropping it releases the lock");
    }
}
