//! The daemon's places on the file system: its state directory (created, checked, locked)
//! and its socket (bound, replacing a stale one but never a live daemon's).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

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

/// Holds an exclusive lock on the state directory for the daemon's life: two daemons on
/// one database would each finalize what the other tracks.
pub(super) fn lock_state_dir(dir: &Path) -> Result<File, StartError> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(|_| StartError::StateLocked(dir.into()))?;
    Ok(file)
}

/// Binds the socket, replacing a stale one left by a crash but never a live daemon's.
pub(super) fn bind_socket(path: &Path) -> Result<UnixListener, StartError> {
    if let Some(parent) = path.parent() {
        create_dir(parent, DirUse::Socket)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(StartError::SocketInUse(path.into()));
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
