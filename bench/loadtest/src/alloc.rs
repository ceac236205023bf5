//! A counting global allocator: bytes and calls allocated on threads marked as server threads,
//! plus the process-wide live byte count. Counting is off unless enabled, so the throughput runs
//! pay one relaxed load per allocation and nothing else.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
};

/// The allocator installed by `main.rs`.
pub struct Counting;

static ENABLED: AtomicBool = AtomicBool::new(false);
static SERVER_BYTES: AtomicU64 = AtomicU64::new(0);
static SERVER_CALLS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static SERVER_LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    // const-initialised and without a destructor, so reading it never allocates.
    static SERVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn on_alloc(size: usize) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    LIVE_BYTES.fetch_add(size as i64, Ordering::Relaxed);
    if SERVER_THREAD.try_with(Cell::get).unwrap_or(false) {
        SERVER_BYTES.fetch_add(size as u64, Ordering::Relaxed);
        SERVER_CALLS.fetch_add(1, Ordering::Relaxed);
        SERVER_LIVE.fetch_add(size as i64, Ordering::Relaxed);
    }
}

fn on_dealloc(size: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_sub(size as i64, Ordering::Relaxed);
        // Server and client share no heap objects (they talk over TCP), so what server threads
        // allocate is freed on server threads and this balance is the server's live heap.
        if SERVER_THREAD.try_with(Cell::get).unwrap_or(false) {
            SERVER_LIVE.fetch_sub(size as i64, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters have no effect
// on the returned memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        on_alloc(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        on_alloc(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        on_dealloc(layout.size());
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A realloc is counted as a fresh allocation of the new size: that is what it can cost.
        on_dealloc(layout.size());
        on_alloc(new_size);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Marks the calling thread as a server thread (called from the server runtime's thread hook).
pub fn mark_server_thread() {
    SERVER_THREAD.with(|s| s.set(true));
}

/// Turns counting on or off.
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
}

/// A snapshot of the counters.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    /// Bytes allocated on server threads since start (only while enabled).
    pub server_bytes: u64,
    /// Allocation calls on server threads.
    pub server_calls: u64,
    /// Bytes allocated and not yet freed, process-wide, counted while enabled.
    pub live_bytes: i64,
    /// Bytes allocated minus freed on server threads.
    pub server_live_bytes: i64,
}

/// Reads the counters.
pub fn snapshot() -> Snapshot {
    Snapshot {
        server_bytes: SERVER_BYTES.load(Ordering::SeqCst),
        server_calls: SERVER_CALLS.load(Ordering::SeqCst),
        live_bytes: LIVE_BYTES.load(Ordering::SeqCst),
        server_live_bytes: SERVER_LIVE.load(Ordering::SeqCst),
    }
}
