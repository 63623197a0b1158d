//! Where the daemon keeps its state and listens, when nothing says otherwise.
//!
//! Root: `/var/lib/liveness` and `/run/liveness/liveness.sock` (what the systemd unit's
//! StateDirectory/RuntimeDirectory create). Others: `$XDG_STATE_HOME/liveness` (or
//! `~/.local/state/liveness`) and `$XDG_RUNTIME_DIR/liveness.sock`. `LIVENESS_STATE_DIR`
//! and `LIVENESS_SOCKET` override both, and flags override those.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where a root daemon (and the systemd unit) listens.
pub const SYSTEM_SOCKET: &str = "/run/liveness/liveness.sock";
pub const SOCKET_ENV: &str = "LIVENESS_SOCKET";
pub const STATE_DIR_ENV: &str = "LIVENESS_STATE_DIR";

/// The environment the defaults are computed from; a struct so tests need not mutate the
/// process environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub uid: u32,
    pub socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub xdg_state_home: Option<PathBuf>,
    pub xdg_runtime_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

impl Env {
    pub fn from_process() -> Env {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Env {
            uid: rustix::process::getuid().as_raw(),
            socket: var(SOCKET_ENV),
            state_dir: var(STATE_DIR_ENV),
            xdg_state_home: var("XDG_STATE_HOME"),
            xdg_runtime_dir: var("XDG_RUNTIME_DIR"),
            home: var("HOME"),
        }
    }

    /// `None` for a user with no runtime, state or home directory.
    pub fn default_socket(&self) -> Option<PathBuf> {
        if let Some(socket) = &self.socket {
            return Some(socket.clone());
        }
        match (&self.xdg_runtime_dir, self.uid) {
            (_, 0) => Some(PathBuf::from(SYSTEM_SOCKET)),
            (Some(runtime), _) => Some(runtime.join("liveness.sock")),
            // Without a runtime dir, a per-user socket beside the state is still private.
            (None, _) => Some(self.default_state_dir()?.join("liveness.sock")),
        }
    }

    /// The socket a client connects to: the user's own daemon if one listens at the user's
    /// default, otherwise the system daemon (a user rarely runs their own).
    pub fn client_socket(&self, exists: impl Fn(&Path) -> bool) -> PathBuf {
        match self.default_socket() {
            Some(own) if self.socket.is_some() || self.uid == 0 || exists(&own) => own,
            _ => PathBuf::from(SYSTEM_SOCKET),
        }
    }

    /// `None` for a user with neither `$XDG_STATE_HOME` nor `$HOME`.
    pub fn default_state_dir(&self) -> Option<PathBuf> {
        if let Some(dir) = &self.state_dir {
            return Some(dir.clone());
        }
        if self.uid == 0 {
            return Some(PathBuf::from("/var/lib/liveness"));
        }
        match (&self.xdg_state_home, &self.home) {
            (Some(state), _) => Some(state.join("liveness")),
            (None, Some(home)) => Some(home.join(".local/state/liveness")),
            (None, None) => None,
        }
    }
}

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
    fn root_uses_system_locations() {
        let env = Env {
            uid: 0,
            xdg_runtime_dir: Some("/run/user/0".into()),
            ..Env::default()
        };
        assert_eq!(
            env.default_socket(),
            Some(PathBuf::from("/run/liveness/liveness.sock"))
        );
        assert_eq!(
            env.default_state_dir(),
            Some(PathBuf::from("/var/lib/liveness"))
        );
    }

    #[test]
    fn users_use_xdg_locations() {
        let env = Env {
            uid: 1000,
            xdg_runtime_dir: Some("/run/user/1000".into()),
            home: Some("/home/u".into()),
            ..Env::default()
        };
        assert_eq!(
            env.default_socket(),
            Some(PathBuf::from("/run/user/1000/liveness.sock"))
        );
        assert_eq!(
            env.default_state_dir(),
            Some(PathBuf::from("/home/u/.local/state/liveness"))
        );
        let env = Env {
            xdg_state_home: Some("/xdg".into()),
            xdg_runtime_dir: None,
            ..env
        };
        assert_eq!(
            env.default_state_dir(),
            Some(PathBuf::from("/xdg/liveness"))
        );
        assert_eq!(
            env.default_socket(),
            Some(PathBuf::from("/xdg/liveness/liveness.sock"))
        );
    }

    #[test]
    fn clients_fall_back_to_the_system_daemon() {
        let user = Env {
            uid: 1000,
            xdg_runtime_dir: Some("/run/user/1000".into()),
            ..Env::default()
        };
        assert_eq!(user.client_socket(|_| false), PathBuf::from(SYSTEM_SOCKET));
        assert_eq!(
            user.client_socket(|_| true),
            PathBuf::from("/run/user/1000/liveness.sock")
        );
        let pinned = Env {
            socket: Some("/tmp/x.sock".into()),
            ..user
        };
        assert_eq!(
            pinned.client_socket(|_| false),
            PathBuf::from("/tmp/x.sock")
        );
    }

    #[test]
    fn users_without_home_get_no_shared_fallback() {
        let env = Env {
            uid: 1000,
            ..Env::default()
        };
        assert_eq!(env.default_state_dir(), None);
        assert_eq!(env.default_socket(), None);
        assert_eq!(env.client_socket(|_| true), PathBuf::from(SYSTEM_SOCKET));
    }

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

    #[test]
    fn environment_overrides_win() {
        let env = Env {
            uid: 0,
            socket: Some("/tmp/s.sock".into()),
            state_dir: Some("/tmp/state".into()),
            ..Env::default()
        };
        assert_eq!(env.default_socket(), Some(PathBuf::from("/tmp/s.sock")));
        assert_eq!(env.default_state_dir(), Some(PathBuf::from("/tmp/state")));
    }
}
