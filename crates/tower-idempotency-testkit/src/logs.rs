//! Log lines captured from `tracing`, for tests that check what is logged and what never is.

use std::{
    io,
    sync::{Arc, Mutex},
};

use tracing::{subscriber::DefaultGuard, Level};

/// What the subscriber set by [`CapturedLogs::start`] writes: everything logged on the current
/// thread at the given level or above, until the guard drops.
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Captures the current thread's logs at `level` and above (plain text, no colours) until
    /// the returned guard drops.
    pub fn start(level: Level) -> (Self, DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Everything captured so far.
    ///
    /// # Panics
    ///
    /// When the logs are not UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).expect("the logs are UTF-8")
    }
}

impl io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
