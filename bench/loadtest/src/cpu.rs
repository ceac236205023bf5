//! CPU time the server spends, from the kernel's per-thread scheduler statistics
//! (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds on the CPU). Throughput on a shared,
//! loaded machine moves with what the other processes do; the server's CPU time per request
//! moves much less, so it compares two servers measured a few seconds apart more steadily.

use std::sync::Mutex;

/// The harness's server runtime threads (registered by the runtime's thread-start hook).
static SERVER_THREADS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Registers the calling thread as a server thread.
pub(crate) fn register_server_thread() {
    // `/proc/thread-self` links to `<pid>/task/<tid>`.
    if let Ok(path) = std::fs::read_link("/proc/thread-self") {
        let path = format!("/proc/{}/schedstat", path.display());
        SERVER_THREADS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path);
    }
}

/// The first field of a `schedstat` file: nanoseconds on the CPU (0 when unreadable).
fn run_ns(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time of the harness's server threads so far, ns.
pub(crate) fn server_threads_ns() -> u64 {
    let threads = SERVER_THREADS.lock().unwrap_or_else(|p| p.into_inner());
    threads
        .iter()
        .map(|p| run_ns(std::path::Path::new(p)))
        .sum()
}

/// CPU time of every thread of process `pid` so far, ns.
pub(crate) fn process_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .map(|task| run_ns(&task.path().join("schedstat")))
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_shows_cpu_time() {
        let before = process_ns(std::process::id());
        assert!(before > 0, "schedstat is readable");
        // Spin until 10 ms of CPU show up; on a loaded machine that takes longer than 10 ms of
        // wall time, so the bound is generous and only a counter that never moves fails it.
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while process_ns(std::process::id()) < before + 10_000_000
            && started.elapsed() < std::time::Duration::from_secs(20)
        {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        assert!(process_ns(std::process::id()) >= before + 10_000_000);
        std::thread::spawn(register_server_thread).join().unwrap();
        assert_eq!(SERVER_THREADS.lock().unwrap().len(), 1);
    }
}
