//! The daemon's places on the file system: its state directory (created, checked, locked)
//! and its socket (bound, replacing a stale one but never a live daemon's).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use liveness_common::identity::ProcessKey;
use liveness_proc::identity::{Liveness, ProcRoot};

use tokio::net::UnixListener;

use super::StartError;
use crate::trust::DirUse;

/// Creates `path` (and its parents) unless it exists, then refuses it unless it is safe
/// for `usage`. A directory made here gets exactly the mode `usage` allows.
pub(super) fn create_dir(path: &Path, usage: DirUse) -> Result<(), StartError> {
    let mode = match usage {
        DirUse::State => 0o700,
        DirUse::Socket => 0o755,
    };
    let created = !path.exists();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|source| StartError::CreateDir {
            path: path.into(),
            source,
        })?;
    if created {
        // The umask (0077 in the daemon) narrows the mode asked for; a socket directory
        // must let everyone in.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    crate::trust::check_dir(path, rustix::process::geteuid().as_raw(), usage)?;
    Ok(())
}

/// How long a start waits for a lock (and a socket) still held by a child of a daemon
/// that has died: such a child lets go within moments of being scheduled.
const HANDOVER: Duration = Duration::from_secs(10);

/// The state directory's lock, held for the daemon's life: two daemons on one database
/// would each finalize what the other tracks.
#[derive(Debug)]
pub(super) struct StateLock {
    _file: File,
    /// Set when the lock was found held by a dead daemon's child: until then, that child
    /// may still hold the daemon's socket too.
    handover: Option<Instant>,
}

/// Takes the state directory's lock and records this process in it.
///
/// A child the daemon forks shares the lock (a `flock` belongs to the open file, which a
/// fork copies) until it closes its inherited descriptors. If the daemon is killed in that
/// moment, the restart finds the lock held by no daemon: the process recorded in the lock
/// file is gone. The start then waits for the child to let go, rather than refuse as it
/// does when the recorded daemon lives.
pub(super) fn lock_state_dir(dir: &Path) -> Result<StateLock, StartError> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(&path)?;
    let proc = ProcRoot::default();
    let deadline = Instant::now() + HANDOVER;
    let mut handover = None;
    while rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        if !holder_is_gone(&file, &proc) || Instant::now() >= deadline {
            return Err(StartError::StateLocked(dir.into()));
        }
        if handover.is_none() {
            tracing::info!(
                state_dir = %dir.display(),
                "the daemon that held the state directory is gone, and a child it forked still holds its lock: waiting for the child to let go"
            );
        }
        handover = Some(deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let holder = proc
        .stat(std::process::id())
        .map(|stat| format!("{} {}\n", stat.pid, stat.start_ticks))
        .unwrap_or_default();
    file.set_len(0)?;
    file.write_all_at(holder.as_bytes(), 0)?;
    Ok(StateLock {
        _file: file,
        handover,
    })
}

/// Whether the process recorded in a held lock file has exited. A file that names none
/// (written by an older daemon, or unreadable) is a live holder's.
fn holder_is_gone(file: &File, proc: &ProcRoot) -> bool {
    let mut text = [0u8; 64];
    let Ok(len) = file.read_at(&mut text, 0) else {
        return false;
    };
    let holder = std::str::from_utf8(&text[..len]).ok().and_then(|text| {
        let (pid, start_ticks) = text.trim().split_once(' ')?;
        Some(ProcessKey {
            pid: pid.parse().ok()?,
            start_ticks: start_ticks.parse().ok()?,
        })
    });
    holder.is_some_and(|key| matches!(proc.check_key(key), Liveness::Dead(_)))
}

/// Binds the socket, replacing a stale one left by a crash but never a live daemon's. A
/// socket that still answers is a live daemon's, unless `lock` was handed over from a dead
/// one: its child may hold the listener a moment longer.
pub(super) fn bind_socket(path: &Path, lock: &StateLock) -> Result<UnixListener, StartError> {
    if let Some(parent) = path.parent() {
        create_dir(parent, DirUse::Socket)?;
    }
    if path.exists() {
        while std::os::unix::net::UnixStream::connect(path).is_ok() {
            if lock
                .handover
                .is_none_or(|deadline| Instant::now() >= deadline)
            {
                return Err(StartError::SocketInUse(path.into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).map_err(|source| StartError::Listen {
        path: path.into(),
        source,
    })?;
    // Anyone may connect; SO_PEERCRED decides what each caller may see and change.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}
