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
    // A first one at once opens the WAL and its index now, beside the daemon's other files:
    // opened later, they could take the descriptor the listener keeps in reserve for root
    // (see `server::listener`), freed for a moment while the daemon is out of descriptors.
    checkpoint(&conn);
    loop {
        let stop = match stopped.recv_timeout(PERIOD) {
            Err(RecvTimeoutError::Timeout) => false,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
        };
        checkpoint(&conn);
        if stop {
            return;
        }
    }
}

fn checkpoint(conn: &Connection) {
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "WAL checkpoint failed; trying again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use std::time::Instant;

    /// Descriptors of this process that name `file`.
    fn opened(file: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target == file)
            .count()
    }

    /// The checkpoint's own descriptor of the WAL is there at its start, long before its
    /// first period ends: none is opened later (see `run`).
    #[test]
    fn the_wal_is_opened_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("liveness.db");
        let _store = Store::open(&path).unwrap();
        let wal = dir.path().join("liveness.db-wal");
        let before = opened(&wal);
        assert!(before > 0, "the store has its WAL open");
        let _checkpointer = Checkpointer::start(&path).unwrap();
        let deadline = Instant::now() + PERIOD / 2;
        while opened(&wal) == before {
            assert!(
                Instant::now() < deadline,
                "the checkpoint did not open the WAL within {:?}",
                PERIOD / 2
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
