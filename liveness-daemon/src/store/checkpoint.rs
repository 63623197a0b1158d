//! The WAL checkpoint, on a thread of its own. SQLite's automatic checkpoint runs inside
//! the commit that crosses its threshold (two fsyncs, milliseconds), which would put it on
//! the death path every few hundred commits; the writer therefore never checkpoints, and
//! this thread copies the WAL into the database file every [`PERIOD`], in `PASSIVE` mode,
//! which neither waits for nor blocks the writer. Once a checkpoint has copied every frame,
//! the writer's next commit starts the WAL over from its beginning, so it stays bounded.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::BUSY_TIMEOUT;

/// How often the WAL is copied into the database file.
const PERIOD: Duration = Duration::from_millis(500);

/// The checkpointing thread; it stops (after a last checkpoint) when this is dropped.
#[derive(Debug)]
pub struct Checkpointer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path`.
    pub fn start(path: &Path) -> std::io::Result<Checkpointer> {
        let (stop, stopped) = mpsc::channel();
        let path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || run(&path, &stopped))?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(path: &PathBuf, stopped: &mpsc::Receiver<()>) {
    // Never created here: a database deleted meanwhile must stay missing, for the engine
    // to notice.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match Connection::open_with_flags(path, flags).and_then(|conn| {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        Ok(conn)
    }) {
        Ok(conn) => conn,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the database to checkpoint it; the WAL grows until the next start");
            return;
        }
    };
    loop {
        let stop = match stopped.recv_timeout(PERIOD) {
            Err(RecvTimeoutError::Timeout) => false,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
        };
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint failed; trying again");
        }
        if stop {
            return;
        }
    }
}
