//! Writing a user's agent settings without lending the writer's rights to anyone: every
//! agent's installer reads and writes through a [`SettingsDir`]. Root may run an installer
//! for a user (a provisioning script, `sudo -E`), with a `HOME` or a settings path that
//! user controls, so:
//!
//! - The directory is walked one component at a time, from `/` (or the working directory),
//!   each opened relative to the one before, so a component swapped behind the walk's back
//!   cannot redirect it.
//! - Root acts as the owner of what it walks into: from the first directory or link on the
//!   way that another user owns, the thread's effective uid, gid and groups are that
//!   user's. The kernel then checks every later step as it would the user's own, and what
//!   is created (directories, files) is the user's.
//! - The settings directory itself, and every file read or written in it, must not be a
//!   symbolic link: such a path is refused, naming where the link points.
//! - A file is never written in place. A new one is created under a random name
//!   (`O_EXCL|O_NOFOLLOW`), given its final mode and group before its first byte,
//!   fsynced and renamed over the old one. Two installs at once each have their own
//!   temporary file; the last rename wins, and a reader always sees a whole file.

use std::ffi::{CStr, OsStr, OsString};
use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use rustix::process::{Gid, Uid};

/// The mode of a settings file or directory that did not exist: settings may hold keys.
pub const NEW_FILE_MODE: u32 = 0o600;
const NEW_DIR_MODE: u32 = 0o700;
/// Links a walk follows before it gives up, as the kernel's own path walk does.
const MAX_LINKS: usize = 40;

/// Why a settings directory or file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(
        "{} is a symbolic link (to {}): liveness does not write through links in a user's settings; name the file or directory it points to instead",
        .path.display(),
        .target.display()
    )]
    Link { path: PathBuf, target: PathBuf },
    #[error("{} is not a {what}", .path.display())]
    Kind { path: PathBuf, what: &'static str },
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error(
        "{} lies in what {user} owns, and root cannot act as them ({why}): run the command as that user (sudo -u {user} ...)",
        .path.display()
    )]
    Owner {
        path: PathBuf,
        user: String,
        why: String,
    },
}

/// A file as it was read: what a file written in its place keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub bytes: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
    pub gid: u32,
}

/// An open settings directory: every file operation is relative to it, as whoever owns it
/// when root opened it for another user.
#[derive(Debug)]
pub struct SettingsDir {
    fd: OwnedFd,
    path: PathBuf,
    // Dropped after `fd`: the thread acts as the owner until the directory is closed.
    _owner: Option<ActingAs>,
}

impl SettingsDir {
    /// Opens the directory `path`; when `create`, the missing directories are made (mode
    /// 0700, owned by whoever owns their parent). `None` when it does not exist and
    /// `create` is false.
    pub fn open(path: &Path, create: bool) -> Result<Option<SettingsDir>, FileError> {
        let failed = |source: Errno| FileError::Read {
            path: path.to_owned(),
            source: source.into(),
        };
        let mut owner = None;
        let start = if path.is_absolute() { "/" } else { "." };
        let mut dir = open_path(CWD, start).map_err(failed)?;
        act_as_owner(&mut owner, &dir, path)?;
        let mut left: Vec<OsString> = Vec::new();
        push_components(&mut left, path);
        let mut links = 0;
        while let Some(name) = left.pop() {
            let next = match open_path(&dir, &*name) {
                Ok(next) => next,
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&dir, &*name, Mode::from_raw_mode(NEW_DIR_MODE)) {
                        Ok(()) | Err(Errno::EXIST) => open_path(&dir, &*name).map_err(failed)?,
                        Err(e) => {
                            return Err(FileError::Write {
                                path: path.to_owned(),
                                source: e.into(),
                            });
                        }
                    }
                }
                Err(Errno::NOENT) => return Ok(None),
                Err(e) => return Err(failed(e)),
            };
            let stat = rustix::fs::fstat(&next).map_err(failed)?;
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Symlink => {
                    let target = link_target(&next).map_err(failed)?;
                    if left.is_empty() {
                        return Err(FileError::Link {
                            path: path.to_owned(),
                            target,
                        });
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(failed(Errno::LOOP));
                    }
                    // Whoever owns the link chose where it leads: it is followed as them.
                    act_as_owner(&mut owner, &next, path)?;
                    if target.is_absolute() {
                        dir = open_path(CWD, "/").map_err(failed)?;
                    }
                    push_components(&mut left, &target);
                }
                FileType::Directory => {
                    act_as_owner(&mut owner, &next, path)?;
                    dir = next;
                }
                _ => {
                    return Err(FileError::Kind {
                        path: path.to_owned(),
                        what: "directory",
                    });
                }
            }
        }
        // A descriptor that can be read (and so fsynced), of the very directory walked to.
        let fd = rustix::fs::openat(
            &dir,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(failed)?;
        Ok(Some(SettingsDir {
            fd,
            path: path.to_owned(),
            _owner: owner,
        }))
    }

    /// The path of `name` in this directory, for messages.
    pub fn path_of(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// The file `name`, or `None` when there is none; a link or anything but a regular
    /// file is refused.
    pub fn read(&self, name: &OsStr) -> Result<Option<Existing>, FileError> {
        let failed = |source: Errno| FileError::Read {
            path: self.path_of(name),
            source: source.into(),
        };
        // NONBLOCK: a FIFO planted under the name must not hold the open.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => return Err(self.link_error(name)),
            Err(e) => return Err(failed(e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(failed)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(FileError::Kind {
                path: self.path_of(name),
                what: "regular file",
            });
        }
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .read_to_end(&mut bytes)
            .map_err(|source| FileError::Read {
                path: self.path_of(name),
                source,
            })?;
        Ok(Some(Existing {
            bytes,
            mode: stat.st_mode & 0o777,
            gid: stat.st_gid,
        }))
    }

    /// Puts `bytes` in place of the file `name` (created if missing), with the mode and
    /// group of `like` (or [`NEW_FILE_MODE`]).
    pub fn replace(
        &self,
        name: &OsStr,
        bytes: &[u8],
        like: Option<&Existing>,
    ) -> Result<(), FileError> {
        let temporary = self.temporary(name, bytes, like)?;
        let renamed = rustix::fs::renameat(&self.fd, &*temporary, &self.fd, name);
        self.settle(name, &temporary, renamed)
    }

    /// Creates the file `name` with `bytes`, mode and group of `like`, unless it exists:
    /// then it is kept as it is and `false` is returned. A link under the name is refused.
    pub fn create_new(
        &self,
        name: &OsStr,
        bytes: &[u8],
        like: &Existing,
    ) -> Result<bool, FileError> {
        let temporary = self.temporary(name, bytes, Some(like))?;
        let renamed = rustix::fs::renameat_with(
            &self.fd,
            &*temporary,
            &self.fd,
            name,
            RenameFlags::NOREPLACE,
        );
        if renamed == Err(Errno::EXIST) {
            self.unlink(&temporary);
            let stat = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW);
            if stat.is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink) {
                return Err(self.link_error(name));
            }
            return Ok(false);
        }
        self.settle(name, &temporary, renamed)?;
        Ok(true)
    }

    /// Removes the file `name`.
    pub fn remove(&self, name: &OsStr) -> Result<(), FileError> {
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).map_err(|e| FileError::Write {
            path: self.path_of(name),
            source: e.into(),
        })?;
        self.sync(name)
    }

    /// A new file beside `name` holding `bytes`, private from its creation, with its final
    /// mode and group before its first byte: its name.
    fn temporary(
        &self,
        name: &OsStr,
        bytes: &[u8],
        like: Option<&Existing>,
    ) -> Result<OsString, FileError> {
        let failed = |source: io::Error| FileError::Write {
            path: self.path_of(name),
            source,
        };
        let mut random = [0u8; 8];
        rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| failed(e.into()))?;
        let mut temporary = OsString::from(".");
        temporary.push(name);
        temporary.push(format!(".liveness-{:016x}", u64::from_ne_bytes(random)));
        let fd = rustix::fs::openat(
            &self.fd,
            &*temporary,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| failed(e.into()))?;
        let filled = (|| -> io::Result<()> {
            // Exactly the mode wanted, whatever the umask took away at the creation.
            let mode = like.map_or(NEW_FILE_MODE, |file| file.mode);
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            if let Some(file) = like {
                match rustix::fs::fchown(&fd, None, Some(Gid::from_raw(file.gid))) {
                    // A group the writer is not in cannot be given: the file has the
                    // writer's own, with the same mode.
                    Ok(()) | Err(Errno::PERM) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let mut written = 0;
            while written < bytes.len() {
                written += rustix::io::write(&fd, &bytes[written..])?;
            }
            rustix::fs::fsync(&fd)?;
            Ok(())
        })();
        match filled {
            Ok(()) => Ok(temporary),
            Err(e) => {
                self.unlink(&temporary);
                Err(failed(e))
            }
        }
    }

    /// After the rename of `temporary` to `name`: the temporary file is gone either way,
    /// and a done rename is made durable.
    fn settle(
        &self,
        name: &OsStr,
        temporary: &OsStr,
        renamed: rustix::io::Result<()>,
    ) -> Result<(), FileError> {
        if let Err(e) = renamed {
            self.unlink(temporary);
            return Err(FileError::Write {
                path: self.path_of(name),
                source: e.into(),
            });
        }
        self.sync(name)
    }

    fn sync(&self, name: &OsStr) -> Result<(), FileError> {
        rustix::fs::fsync(&self.fd).map_err(|e| FileError::Write {
            path: self.path_of(name),
            source: e.into(),
        })
    }

    fn unlink(&self, name: &OsStr) {
        // Best effort: it is already a failure being reported.
        let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
    }

    fn link_error(&self, name: &OsStr) -> FileError {
        let target = rustix::fs::readlinkat(&self.fd, name, Vec::new())
            .map(|target| PathBuf::from(OsString::from_vec(target.into_bytes())))
            .unwrap_or_default();
        FileError::Link {
            path: self.path_of(name),
            target,
        }
    }
}

/// `name` relative to `dir`, without following it when it is a link: a handle to walk on.
fn open_path<Fd: std::os::fd::AsFd>(
    dir: Fd,
    name: impl rustix::path::Arg,
) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn link_target(link: &OwnedFd) -> rustix::io::Result<PathBuf> {
    let target = rustix::fs::readlinkat(link, c"", Vec::new())?;
    Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
}

/// Puts the components of `path` on the stack `left`, the first on top; the root and `.`
/// are left out (the walk starts at the root for an absolute path).
fn push_components(left: &mut Vec<OsString>, path: &Path) {
    for component in path.components().rev() {
        match component {
            Component::Normal(name) => left.push(name.to_owned()),
            Component::ParentDir => left.push("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

/// When this thread is root and not yet acting for anyone, and `handle` (a directory or a
/// link the walk reached) belongs to another user: from now on, the thread acts as them.
fn act_as_owner(
    owner: &mut Option<ActingAs>,
    handle: &OwnedFd,
    path: &Path,
) -> Result<(), FileError> {
    if owner.is_some() || !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let stat = rustix::fs::fstat(handle).map_err(|e| FileError::Read {
        path: path.to_owned(),
        source: e.into(),
    })?;
    if stat.st_uid == 0 {
        return Ok(());
    }
    let refused = |user: String, why: String| FileError::Owner {
        path: path.to_owned(),
        user,
        why,
    };
    let uid = stat.st_uid;
    // Without an entry in the user database, the group of what they own is their group,
    // unless it is root's.
    let account = match Account::of(uid) {
        Some(account) => account,
        None if stat.st_gid == 0 => {
            return Err(refused(
                format!("'#{uid}'"),
                format!("uid {uid} has no account, and what it owns has root's group"),
            ));
        }
        None => Account {
            name: format!("'#{uid}'"),
            uid,
            gid: stat.st_gid,
            groups: vec![stat.st_gid],
        },
    };
    *owner = Some(
        ActingAs::become_(&account).map_err(|e| refused(account.name.clone(), e.to_string()))?,
    );
    Ok(())
}

/// A user as the thread acts as them: uid, primary group and groups.
#[derive(Debug)]
struct Account {
    /// Their name, or `'#UID'` (as sudo takes it, quoted for the shell) when they have none.
    name: String,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Account {
    /// The account of `uid` in the user database, if it has one.
    fn of(uid: u32) -> Option<Account> {
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: an all-zero passwd is a valid value for getpwuid_r to fill.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found = std::ptr::null_mut();
        // SAFETY: the buffers are valid for their given lengths; the strings it fills point
        // into `buffer`, which outlives their use below.
        let status = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if status != 0 || found.is_null() {
            return None;
        }
        // SAFETY: pw_name is a NUL-terminated string in `buffer`.
        let name = unsafe { CStr::from_ptr(entry.pw_name) };
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut count = groups.len() as libc::c_int;
        // SAFETY: `groups` holds `count` entries; a list longer than that fails (-1), and
        // then only the primary group is used.
        let listed = unsafe {
            libc::getgrouplist(name.as_ptr(), entry.pw_gid, groups.as_mut_ptr(), &mut count)
        };
        groups.truncate(if listed < 0 { 0 } else { count as usize });
        if groups.is_empty() {
            groups.push(entry.pw_gid);
        }
        Some(Account {
            name: OsStr::from_bytes(name.to_bytes())
                .to_string_lossy()
                .into_owned(),
            uid,
            gid: entry.pw_gid,
            groups,
        })
    }
}

/// The current thread acting as another user: its effective uid, gid and groups are the
/// user's, its real and saved ids stay root's, so that the drop comes back. The calls are
/// the kernel's per-thread ones (not libc's, which change every thread), so other threads
/// keep their rights; and the type cannot leave its thread.
#[derive(Debug)]
struct ActingAs {
    gid: Gid,
    groups: Vec<Gid>,
    _thread: PhantomData<*const ()>,
}

impl ActingAs {
    fn become_(account: &Account) -> io::Result<ActingAs> {
        // Made first, so that a failure half-way is undone by its drop.
        let acting = ActingAs {
            gid: rustix::process::getegid(),
            groups: rustix::process::getgroups()?,
            _thread: PhantomData,
        };
        let groups: Vec<Gid> = account.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        rustix::thread::set_thread_groups(&groups)?;
        rustix::thread::set_thread_res_gid(None, Gid::from_raw(account.gid), None)?;
        // Last: it drops root's capabilities, which the calls above need.
        rustix::thread::set_thread_res_uid(None, Uid::from_raw(account.uid), None)?;
        Ok(acting)
    }
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // The effective uid first: back to root, the capabilities for the rest come back.
        // Should a call fail, the thread stays with the user's rights, never more.
        let _ = rustix::thread::set_thread_res_uid(None, Uid::ROOT, None);
        let _ = rustix::thread::set_thread_res_gid(None, self.gid, None);
        let _ = rustix::thread::set_thread_groups(&self.groups);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn existing(mode: u32) -> Existing {
        Existing {
            bytes: Vec::new(),
            mode,
            gid: rustix::process::getegid().as_raw(),
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn files_get_their_mode_whatever_the_umask_and_leave_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let settings = SettingsDir::open(dir.path(), false).unwrap().unwrap();
        // 0666: more than any umask but 0 lets a created file have.
        settings
            .replace("a".as_ref(), b"{}", Some(&existing(0o666)))
            .unwrap();
        settings.replace("b".as_ref(), b"{}", None).unwrap();
        assert_eq!(mode(&dir.path().join("a")), 0o666);
        assert_eq!(mode(&dir.path().join("b")), NEW_FILE_MODE);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn missing_directories_are_made_private_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/../c");
        assert!(SettingsDir::open(&deep, false).unwrap().is_none());
        SettingsDir::open(&deep, true).unwrap().unwrap();
        assert_eq!(mode(&dir.path().join("a/c")), NEW_DIR_MODE);
    }

    #[test]
    fn links_are_followed_on_the_way_but_never_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("real/cfg")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("way")).unwrap();
        std::os::unix::fs::symlink("real/cfg", dir.path().join("cfg")).unwrap();
        let settings = SettingsDir::open(&dir.path().join("way/cfg"), false)
            .unwrap()
            .unwrap();
        settings.replace("s.json".as_ref(), b"{}", None).unwrap();
        assert!(dir.path().join("real/cfg/s.json").exists());

        let error = SettingsDir::open(&dir.path().join("cfg"), true).unwrap_err();
        assert!(
            matches!(&error, FileError::Link { target, .. } if target == Path::new("real/cfg")),
            "{error}"
        );
        std::os::unix::fs::symlink("s.json", dir.path().join("real/cfg/link.json")).unwrap();
        let error = settings.read("link.json".as_ref()).unwrap_err();
        assert!(error.to_string().contains("is a symbolic link (to s.json)"));
    }

    #[test]
    fn create_new_keeps_what_is_there_and_refuses_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let settings = SettingsDir::open(dir.path(), false).unwrap().unwrap();
        assert!(
            settings
                .create_new("b".as_ref(), b"first", &existing(0o600))
                .unwrap()
        );
        assert!(
            !settings
                .create_new("b".as_ref(), b"second", &existing(0o600))
                .unwrap()
        );
        assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"first");
        std::os::unix::fs::symlink("b", dir.path().join("l")).unwrap();
        assert!(matches!(
            settings.create_new("l".as_ref(), b"x", &existing(0o600)),
            Err(FileError::Link { .. })
        ));
        assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"first");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
