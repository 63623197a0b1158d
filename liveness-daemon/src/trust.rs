//! Refusing state and socket directories that another user could read or replace.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A directory the daemon will not trust with its state or socket.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedDir {
    #[error(
        "{path} belongs to uid {owner}, not to the daemon's uid {uid}: another user could \
         read or replace what is in it. Remove it, or `chown {uid} {path}`, and start again"
    )]
    ForeignOwner { path: PathBuf, owner: u32, uid: u32 },
    #[error(
        "{path} has mode {mode:04o}: other users could {what}. `chmod {fix:04o} {path}` and \
         start again"
    )]
    Mode {
        path: PathBuf,
        mode: u32,
        what: &'static str,
        fix: u32,
    },
    #[error("cannot check {path}: {source}")]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a directory is for, which sets who else may use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirUse {
    /// The database and lock: the daemon's uid alone.
    State,
    /// The socket: others may enter to connect (SO_PEERCRED tells them apart), but only the
    /// daemon's uid (or root) may create, remove or replace what is in it.
    Socket,
}

/// Refuses a directory not owned by `uid` (root too, for a socket directory) or open to
/// others beyond what `usage` allows.
pub fn check_dir(path: &Path, uid: u32, usage: DirUse) -> Result<(), UntrustedDir> {
    let metadata = std::fs::metadata(path).map_err(|source| UntrustedDir::Stat {
        path: path.into(),
        source,
    })?;
    let owner = metadata.uid();
    if owner != uid && !(usage == DirUse::Socket && owner == 0) {
        return Err(UntrustedDir::ForeignOwner {
            path: path.into(),
            owner,
            uid,
        });
    }
    let mode = metadata.mode() & 0o7777;
    let (forbidden, what, fix) = match usage {
        DirUse::State => (0o077, "read the database or replace it", 0o700),
        DirUse::Socket => (0o022, "replace the socket with their own", 0o755),
    };
    if mode & forbidden != 0 {
        return Err(UntrustedDir::Mode {
            path: path.into(),
            mode,
            what,
            fix,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_open_to_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        let chmod = |mode| {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        chmod(0o700);
        check_dir(dir.path(), uid, DirUse::State).expect("0700 is private");
        check_dir(dir.path(), uid, DirUse::Socket).expect("0700 is fine for a socket");
        chmod(0o755);
        let refused = check_dir(dir.path(), uid, DirUse::State).expect_err("0755 state");
        assert!(refused.to_string().contains("chmod 0700"), "{refused}");
        check_dir(dir.path(), uid, DirUse::Socket).expect("others may enter to connect");
        chmod(0o777);
        let refused = check_dir(dir.path(), uid, DirUse::Socket).expect_err("0777 socket");
        assert!(refused.to_string().contains("chmod 0755"), "{refused}");
        chmod(0o700);
        let refused = check_dir(dir.path(), uid + 1, DirUse::State).expect_err("foreign");
        assert!(refused.to_string().contains("chown"), "{refused}");
    }
}
