//! Who an action runs as: the session's creator, as the user databases describe it.

use std::ffi::{CStr, OsString};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use super::ActionError;
use super::sys::Ids;

/// The kernel's default overflow gid (`/proc/sys/kernel/overflowgid`, "nogroup"): the group
/// of a user the databases do not know and who registered without a known group.
pub const OVERFLOW_GID: u32 = 65_534;

/// The user an action runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<u32>,
    /// `USER` and `LOGNAME`.
    pub name: String,
    /// `HOME`, and the working directory of an action registered without one.
    pub home: PathBuf,
    pub shell: PathBuf,
}

impl RunAs {
    /// The creator `uid` with its primary group and every group the group database gives
    /// it (as `initgroups` would), its name, home and shell.
    ///
    /// A uid the databases do not know (a container's, a deleted user's) gets the primary
    /// group it had when it registered (`registered_gid`, which the daemon read with
    /// `SO_PEERCRED`), else [`OVERFLOW_GID`]; never a group of the same number, which may be
    /// another's (uid 27 is not group 27, `sudo` on Debian). It has no supplementary groups,
    /// its name is its number, its home `/` and its shell `/bin/sh`.
    pub fn lookup(uid: u32, registered_gid: Option<u32>) -> Result<RunAs, ActionError> {
        let account = lookup_account(uid).map_err(|source| ActionError::Lookup { uid, source })?;
        Ok(match account {
            Some(account) if account.shell.as_os_str().is_empty() => RunAs {
                shell: PathBuf::from("/bin/sh"),
                ..account
            },
            Some(account) => account,
            None => RunAs::unknown(uid, registered_gid.unwrap_or(OVERFLOW_GID)),
        })
    }

    /// A user the databases do not know, with primary group `gid` and no other.
    pub fn unknown(uid: u32, gid: u32) -> RunAs {
        RunAs {
            uid,
            gid,
            groups: Vec::new(),
            name: uid.to_string(),
            home: PathBuf::from("/"),
            shell: PathBuf::from("/bin/sh"),
        }
    }

    /// The ids the child takes on, for a daemon whose effective uid is `daemon`: a root
    /// daemon always sets them (also for a session of root's), the way cron and
    /// `systemd-run --uid` do; a daemon that is the user itself keeps its own; any other
    /// daemon cannot run the action, which never runs as a user other than its creator.
    pub fn ids_for(&self, daemon: u32) -> Result<Option<Ids>, ActionError> {
        if daemon == 0 {
            Ok(Some(Ids {
                uid: self.uid,
                gid: self.gid,
                groups: self.groups.clone(),
            }))
        } else if daemon == self.uid {
            Ok(None)
        } else {
            Err(ActionError::OtherUser {
                daemon,
                uid: self.uid,
            })
        }
    }
}

/// The passwd entry of `uid` with its groups, or `None` when the databases have none.
fn lookup_account(uid: u32) -> io::Result<Option<RunAs>> {
    let mut buffer = vec![0u8; 1024];
    loop {
        // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids); getpwuid_r fills it.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: the buffer outlives every pointer the entry holds into it, which are read
        // before the next iteration reuses or grows it.
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut found,
            )
        };
        match rc {
            0 if found.is_null() => return Ok(None),
            0 => {
                // SAFETY: getpwuid_r succeeded: the strings are NUL-terminated in `buffer`.
                let text = |p: *const libc::c_char| unsafe { CStr::from_ptr(p) }.to_owned();
                let path = |p| PathBuf::from(OsString::from_vec(text(p).into_bytes()));
                let name = text(entry.pw_name);
                let groups = group_list(&name, entry.pw_gid)?;
                return Ok(Some(RunAs {
                    uid,
                    gid: entry.pw_gid,
                    groups,
                    name: name.to_string_lossy().into_owned(),
                    home: path(entry.pw_dir),
                    shell: path(entry.pw_shell),
                }));
            }
            libc::ERANGE if buffer.len() < 1 << 20 => buffer.resize(buffer.len() * 2, 0),
            // What getpwuid_r(3) lists for "not found", as some databases report it (the
            // files one without an /etc/passwd, on a minimal system).
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            errno => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

/// `getgrouplist`: the groups `initgroups` would give the user.
fn group_list(name: &CStr, gid: u32) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut count = libc::c_int::try_from(groups.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `groups` has room for `count` entries; the call writes at most that many
        // and sets `count` to how many there are.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        let count = usize::try_from(count).unwrap_or(0);
        if rc >= 0 {
            groups.truncate(count);
            return Ok(groups);
        }
        if count <= groups.len() || count > 65_536 {
            return Err(io::Error::other(format!(
                "getgrouplist failed for {} ({count} groups)",
                name.to_string_lossy()
            )));
        }
        groups.resize(count, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_comes_from_the_databases_where_they_exist() {
        let root = RunAs::lookup(0, Some(7)).unwrap();
        assert_eq!(root.uid, 0);
        if std::path::Path::new("/etc/passwd").exists() {
            assert_eq!((root.name.as_str(), root.gid), ("root", 0));
            assert!(
                root.groups.contains(&0),
                "initgroups includes the primary group"
            );
        } else {
            // A minimal system (the test VMs): no databases at all.
            assert_eq!(root, RunAs::unknown(0, 7));
        }
    }

    #[test]
    fn an_unknown_uid_gets_its_registered_group_or_the_overflow_group() {
        // The highest uid the kernel accepts is no user's on any ordinary system.
        let uid = u32::MAX - 1;
        let registered = RunAs::lookup(uid, Some(1234)).unwrap();
        assert_eq!(registered, RunAs::unknown(uid, 1234));
        assert_eq!(registered.groups, Vec::<u32>::new());
        assert_eq!(
            RunAs::lookup(uid, None).unwrap().gid,
            OVERFLOW_GID,
            "never the group of the same number"
        );
    }

    #[test]
    fn only_root_or_the_user_itself_runs_an_action() {
        let user = RunAs::unknown(1000, 1000);
        assert_eq!(
            user.ids_for(0).unwrap(),
            Some(Ids {
                uid: 1000,
                gid: 1000,
                groups: vec![]
            })
        );
        assert_eq!(
            user.ids_for(1000).unwrap(),
            None,
            "a per-user daemon keeps its ids"
        );
        let refused = user.ids_for(1001).unwrap_err().to_string();
        assert!(
            refused.contains("uid 1001") && refused.contains("uid 1000"),
            "{refused}"
        );
    }
}
