//! Where the daemon keeps its state and listens, when nothing says otherwise.
//!
//! Root: `/var/lib/liveness` and `/run/liveness/liveness.sock` (what the systemd unit's
//! StateDirectory/RuntimeDirectory create). Others: `$XDG_STATE_HOME/liveness` (or
//! `~/.local/state/liveness`) and `$XDG_RUNTIME_DIR/liveness.sock`. `LIVENESS_STATE_DIR`
//! and `LIVENESS_SOCKET` override both, and flags override those.

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

    /// Whether the daemon may create `dir` to put its socket in: only the directory of its
    /// own default socket (`/run/liveness` for root), whatever `LIVENESS_SOCKET` says. A
    /// directory named by the user that does not exist is more likely a typo than a wish,
    /// and one created as root would be left behind.
    pub fn may_create_socket_dir(&self, dir: &Path) -> bool {
        let own_default = Env {
            socket: None,
            ..self.clone()
        }
        .default_socket();
        own_default.as_deref().and_then(Path::parent) == Some(dir)
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

    #[test]
    fn only_the_default_socket_directory_may_be_created() {
        let root = Env::default();
        assert!(root.may_create_socket_dir(Path::new("/run/liveness")));
        assert!(!root.may_create_socket_dir(Path::new("/nonexistent/dir")));
        let overridden = Env {
            socket: Some("/elsewhere/x.sock".into()),
            ..Env::default()
        };
        assert!(overridden.may_create_socket_dir(Path::new("/run/liveness")));
        assert!(!overridden.may_create_socket_dir(Path::new("/elsewhere")));
        let user = Env {
            uid: 1000,
            xdg_runtime_dir: Some("/run/user/1000".into()),
            ..Env::default()
        };
        assert!(user.may_create_socket_dir(Path::new("/run/user/1000")));
        assert!(!user.may_create_socket_dir(Path::new("/run/liveness")));
    }
}
