//! Authorization: who a client is, and which sessions (namespaces by uid) it may name.

use super::Refusal;
use liveness_common::session::Session;

/// A client, as `SO_PEERCRED` identifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    /// The primary group it connected with: the group of its end actions should the user
    /// databases not know its uid.
    pub gid: u32,
    /// In the daemon's PID namespace; 0 when the client is not visible there.
    pub pid: u32,
}

impl Caller {
    /// The daemon's own tasks (the metrics listener, the activity sampler), which ask as
    /// root would.
    pub const DAEMON: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };

    pub(super) fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Non-root callers see and change only the sessions they created.
    pub(super) fn may_see(&self, session: &Session) -> bool {
        self.is_root() || session.creator_uid == self.uid
    }

    /// The creator filter for listings and streams: none for root.
    pub fn creator_filter(&self) -> Option<u32> {
        (!self.is_root()).then_some(self.uid)
    }

    /// The session-id namespace a request with this `uid` field addresses: a user's own
    /// always; for root, the user it names, or `None` (any user's) without one.
    pub fn namespace(&self, uid: Option<u32>) -> Result<Option<u32>, Refusal> {
        match uid {
            Some(uid) if !self.is_root() && uid != self.uid => {
                Err(Refusal::OthersSessions { caller: self.uid })
            }
            Some(uid) => Ok(Some(uid)),
            None => Ok(self.creator_filter()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_names_another_users_namespace() {
        let user = Caller {
            uid: 1000,
            gid: 1000,
            pid: 1,
        };
        let root = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        assert_eq!(user.namespace(None).unwrap(), Some(1000), "a user's own");
        assert_eq!(user.namespace(Some(1000)).unwrap(), Some(1000));
        let refused = user.namespace(Some(2000)).unwrap_err();
        assert!(
            matches!(refused, Refusal::OthersSessions { caller: 1000 }),
            "{refused}"
        );
        assert_eq!(root.namespace(Some(2000)).unwrap(), Some(2000));
        assert_eq!(root.namespace(None).unwrap(), None, "root: any user's");
    }
}
