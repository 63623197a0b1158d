//! Keeping the lineage programs and their map across daemon restarts, pinned in bpffs, so
//! that a process orphaned while no daemon ran is still placed in its tree.
//!
//! Only the lineage programs (`lineage_fork`, `lineage_exit`) and the `lineages` map are
//! pinned; every other program and map (tracked, members, their slot counters, the ring
//! buffer) is the running daemon's own and goes with it. Invariants:
//! - a pinned program writes only pinned maps: no program that outlives a daemon writes a
//!   map that the next daemon starts afresh, so the member accounting (member_slots,
//!   uid_shares) counts exactly the entries of the map this daemon created;
//! - a pin set is adopted only by a daemon that loads the same object with the same
//!   constants the pinned programs read (its directory is named by their hash), and only
//!   whole (both links and the map); anything else is removed and loaded afresh;
//! - a pin set belongs to one state directory (its parent directory is named by a hash of
//!   the state directory's path), which one daemon at a time holds locked: two daemons
//!   never share one, and the one holding it is the only one to change it;
//! - that parent directory records its state directory (the `owner` symlink, whose target
//!   is the path: bpffs holds no regular files), so that a daemon starting finds the sets
//!   of state directories deleted since and removes them, detaching their programs. A set
//!   whose owner is unknown (no record, or one that does not match the name) or whose
//!   state directory exists is never removed by another daemon;
//! - the daemon using a state directory's pins holds a lock on their directory (`flock`) for
//!   its life, and a set is removed as stale only under that lock: a running daemon's pins
//!   are never removed by another, whatever their owner record says (a forged one, or a
//!   state directory deleted under the running daemon). Entries are opened without
//!   following links, and a link is never removed as a set;
//! - an older pin set of the same state directory is removed only once the new programs are
//!   attached, so forks are recorded throughout an upgrade.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use aya::programs::links::{FdLink, PinnedLink};

/// `BPF_FS_MAGIC` of linux/magic.h: the `f_type` of a bpffs.
const BPF_FS_MAGIC: u64 = 0xcafe_4a11;
/// Where systemd mounts bpffs on ordinary distributions.
const BPF_FS_MOUNT: &str = "/sys/fs/bpf";
/// The pin of the link of the lineage fork program, whose time is the set's load time.
pub(super) const FORK_LINK: &str = "lineage_fork";
pub(super) const EXIT_LINK: &str = "lineage_exit";
pub(super) const LINEAGES_PIN: &str = "lineages";
/// The owner record of a state directory's pins: a symlink to the state directory.
const OWNER: &str = "owner";
/// The name of a state directory's pins starts so, followed by the hash of its path.
const STATE_PREFIX: &str = "state-";

/// Why a pin set cannot be used: the daemon then runs with unpinned lineage programs.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{0} is not on a bpffs (mount -t bpf bpf {BPF_FS_MOUNT})")]
    NotBpffs(PathBuf),
    #[error("cannot mount bpffs on {BPF_FS_MOUNT}: {0}")]
    Mount(#[source] io::Error),
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} is held by another running daemon")]
    InUse(PathBuf),
    #[error("cannot pin the link of {name}: {source}")]
    Link {
        name: &'static str,
        #[source]
        source: aya::pin::PinError,
    },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PinError {
    let path = path.to_path_buf();
    move |source| PinError::Io { what, path, source }
}

/// 64-bit FNV-1a: a name that stays the same across builds and Rust versions (the standard
/// library's hasher does not promise that).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|part| part.iter())
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// The pins of the daemon whose state is in one state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePins {
    /// The directory of its pin sets, under the pin root.
    pub dir: PathBuf,
    /// The state directory, as recorded in `dir`.
    pub owner: PathBuf,
}

impl StatePins {
    /// The pins, under `root`, of the daemon whose state is `state_dir`.
    pub fn of(root: &Path, state_dir: &Path) -> StatePins {
        let owner = fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        StatePins {
            dir: root.join(state_dir_name(&owner)),
            owner,
        }
    }
}

/// The name of the directory of the pins of the state directory `owner`.
fn state_dir_name(owner: &Path) -> String {
    let key = fnv1a(&[owner.as_os_str().as_encoded_bytes()]);
    format!("{STATE_PREFIX}{key:016x}")
}

/// An entry of the pin root, and the state directory it belongs to.
#[derive(Debug)]
pub struct FoundPins {
    pub path: PathBuf,
    /// The state directory, or why it is not known (the entry is then left alone).
    pub owner: Result<PathBuf, String>,
}

impl FoundPins {
    /// Whether the owner's state directory exists. Anything but "not found" (no access,
    /// say) counts as existing: a set is removed only when its owner is surely gone.
    pub fn owner_exists(&self) -> Option<bool> {
        let owner = self.owner.as_ref().ok()?;
        Some(
            !matches!(fs::symlink_metadata(owner), Err(error) if error.kind() == io::ErrorKind::NotFound),
        )
    }
}

/// The entries of the pin root `root` (none when it does not exist or is not on bpffs,
/// where no daemon pins).
pub fn find(root: &Path) -> Result<Vec<FoundPins>, PinError> {
    if !on_bpffs(root) {
        return Ok(Vec::new());
    }
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io_error("list", root)(error)),
    };
    let mut found: Vec<FoundPins> = entries
        .map(|entry| {
            let path = entry.map_err(io_error("list", root))?.path();
            let owner = owner_of(&path);
            Ok(FoundPins { path, owner })
        })
        .collect::<Result<_, PinError>>()?;
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The state directory the pins in `path` belong to, from its owner record, checked
/// against the directory's name: a record that does not match is not trusted.
fn owner_of(path: &Path) -> Result<PathBuf, String> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    if !name.starts_with(STATE_PREFIX) {
        return Err("not a state directory's pins (the name does not start with state-)".into());
    }
    let kind = fs::symlink_metadata(path)
        .map_err(|error| format!("cannot read: {error}"))?
        .file_type();
    if !kind.is_dir() {
        return Err(format!("not a directory but a {}", file_kind(kind)));
    }
    let owner = match fs::read_link(path.join(OWNER)) {
        Ok(owner) => owner,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err("no owner record (pinned by an older daemon, or being made now)".into());
        }
        Err(error) => return Err(format!("unreadable owner record: {error}")),
    };
    if !owner.is_absolute() || state_dir_name(&owner) != name {
        return Err(format!(
            "the owner record {} does not match the name",
            owner.display()
        ));
    }
    Ok(owner)
}

fn file_kind(kind: fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "symbolic link"
    } else if kind.is_file() {
        "file (a pinned program or map)"
    } else {
        "special file"
    }
}

/// Removes the pins of state directories that no longer exist, so that their programs stop
/// running on every fork and exit: one log line per set removed, one per entry left alone
/// for want of a known owner. Never fails the start: a sweep that cannot list the root says
/// why.
pub fn remove_stale(root: &Path) {
    let found = match find(root) {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, "cannot look for the lineage pins of removed state directories");
            return;
        }
    };
    for pins in found {
        match (&pins.owner, pins.owner_exists()) {
            (Ok(owner), Some(false)) => match lock(&pins.path) {
                Ok(Some(_held)) => remove_stale_set(&pins.path, owner),
                Ok(None) => tracing::warn!(
                    pins = %pins.path.display(),
                    state_dir = %owner.display(),
                    "left the lineage programs pinned for a state directory that no longer exists: a running daemon holds them"
                ),
                Err(error) => tracing::warn!(
                    pins = %pins.path.display(),
                    state_dir = %owner.display(),
                    %error,
                    "cannot lock the lineage programs pinned for a state directory that no longer exists"
                ),
            },
            (Err(reason), _) => tracing::warn!(
                pins = %pins.path.display(),
                %reason,
                "left an entry of the pin directory as it is: its owner is unknown"
            ),
            _ => {}
        }
    }
}

/// Removes the set at `path`, of the state directory `owner` that no longer exists, under its
/// lock.
fn remove_stale_set(path: &Path, owner: &Path) {
    match fs::remove_dir_all(path) {
        Ok(()) => tracing::info!(
            pins = %path.display(),
            state_dir = %owner.display(),
            "removed the lineage programs pinned for a state directory that no longer exists"
        ),
        Err(error) => tracing::warn!(
            pins = %path.display(),
            state_dir = %owner.display(),
            %error,
            "cannot remove the lineage programs pinned for a state directory that no longer exists"
        ),
    }
}

/// Locks the directory at `path` (`flock`, exclusive), opened without following a link: the
/// lock, or `None` when another process holds it.
fn lock(path: &Path) -> io::Result<Option<OwnedFd>> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let dir = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    match rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(dir)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// The name of the pin set of `object` loaded with `pidns_inum`, the only load-time
/// constant the lineage programs read: a layout or program change names another set.
pub(super) fn set_name(object: &[u8], pidns_inum: u32) -> String {
    format!("{:016x}", fnv1a(&[object, &pidns_inum.to_ne_bytes()]))
}

/// Removes every pin set of a state directory (`livenessd --unpin`): the programs detach
/// and the map is freed. True when there was one.
pub fn unpin(state_pins: &Path) -> Result<bool, PinError> {
    match fs::remove_dir_all(state_pins) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(io_error("remove", state_pins)(error)),
    }
}

/// A pin set this daemon uses.
#[derive(Debug)]
pub(super) struct PinSet {
    /// The set's directory: `<state pins>/<set name>`.
    pub dir: PathBuf,
    /// When the pinned programs were attached (ms since the epoch), if they already were.
    pub adopted_since_ms: Option<i64>,
    /// The pinned links, held open while the daemon runs: removing the pins by hand then
    /// detaches nothing until it stops.
    links: Vec<FdLink>,
    /// The lock on the state directory's pins, held while the daemon runs.
    lock: OwnedFd,
}

impl PinSet {
    /// Finds this object's set under `state_pins`, whole, or makes its directory empty,
    /// after mounting bpffs if it is missing where systemd would have mounted it.
    pub fn open(state_pins: &StatePins, name: &str) -> Result<PinSet, PinError> {
        ensure_bpffs(&state_pins.dir)?;
        let dir = state_pins.dir.join(name);
        // Checked before anything is created: a wrong directory is left as it was.
        if !on_bpffs(&dir) {
            return Err(PinError::NotBpffs(state_pins.dir.clone()));
        }
        fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
        let lock = lock(&state_pins.dir)
            .map_err(io_error("lock", &state_pins.dir))?
            .ok_or_else(|| PinError::InUse(state_pins.dir.clone()))?;
        record_owner(state_pins)?;
        if let Some((since_ms, links)) = adoptable(&dir) {
            return Ok(PinSet {
                dir,
                adopted_since_ms: Some(since_ms),
                links,
                lock,
            });
        }
        // Partly made (a daemon stopped while pinning) or damaged: start it afresh, since
        // programs left attached there may write a map that is not pinned any more.
        fs::remove_dir_all(&dir).map_err(io_error("remove", &dir))?;
        fs::create_dir(&dir).map_err(io_error("create", &dir))?;
        Ok(PinSet {
            dir,
            adopted_since_ms: None,
            links: Vec::new(),
            lock,
        })
    }

    /// Where the lineages map is pinned.
    pub fn lineages(&self) -> PathBuf {
        self.dir.join(LINEAGES_PIN)
    }

    /// Pins the link of a freshly attached lineage program.
    pub fn pin_link(&mut self, name: &'static str, link: FdLink) -> Result<(), PinError> {
        let link = link
            .pin(self.dir.join(name))
            .map_err(|source| PinError::Link { name, source })?;
        self.links.push(link.into());
        Ok(())
    }

    /// The set's links and the lock on its state directory's pins, to be held for this
    /// daemon's life.
    pub fn into_held(self) -> (Vec<FdLink>, OwnedFd) {
        (self.links, self.lock)
    }

    /// Gives the set up after a failure to pin: its pins go, and the links already pinned
    /// are returned, to be held for this daemon's life (closing them would detach them).
    pub fn abandon(self) -> Vec<FdLink> {
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            tracing::warn!(pins = %self.dir.display(), %error, "cannot remove a lineage pin set");
        }
        self.links
    }

    /// When the fresh set's fork link was pinned: lineages are complete since. The pin's
    /// time is what a later daemon reads, so this one reports the same.
    pub fn pinned_since_ms(&self) -> Option<i64> {
        pinned_at(&self.dir.join(FORK_LINK))
    }

    /// Removes the other sets of the same state directory: older versions, whose programs
    /// detach now that this set's are attached.
    pub fn remove_others(&self) {
        let Some(parent) = self.dir.parent() else {
            return;
        };
        let Ok(entries) = fs::read_dir(parent) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path != self.dir && entry.file_name() != OWNER {
                match fs::remove_dir_all(&path) {
                    Ok(()) => tracing::info!(
                        pins = %path.display(),
                        "removed the lineage programs of another daemon version"
                    ),
                    Err(error) => tracing::warn!(
                        pins = %path.display(), %error,
                        "cannot remove the lineage programs of another daemon version"
                    ),
                }
            }
        }
    }
}

/// Records the state directory the pins belong to, in pins made before there were records
/// too.
fn record_owner(state_pins: &StatePins) -> Result<(), PinError> {
    let record = state_pins.dir.join(OWNER);
    if fs::read_link(&record).is_ok_and(|owner| owner == state_pins.owner) {
        return Ok(());
    }
    match fs::remove_file(&record) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            return Err(io_error("replace", &record)(error));
        }
        _ => {}
    }
    std::os::unix::fs::symlink(&state_pins.owner, &record).map_err(io_error("record", &record))
}

/// The time the set in `dir` was first attached, and its links, when both are live links
/// and its map is there.
fn adoptable(dir: &Path) -> Option<(i64, Vec<FdLink>)> {
    let live = |name: &str| {
        let link = FdLink::from(PinnedLink::from_pin(dir.join(name)).ok()?);
        // A pinned map opens too: only a link has link info.
        link.info().ok().map(|_| link)
    };
    let links = vec![live(FORK_LINK)?, live(EXIT_LINK)?];
    if !dir.join(LINEAGES_PIN).exists() {
        return None;
    }
    Some((pinned_at(&dir.join(FORK_LINK))?, links))
}

/// When the pin at `path` was made (ms since the epoch): bpffs sets it once.
fn pinned_at(path: &Path) -> Option<i64> {
    let modified = fs::metadata(path).ok()?.modified().ok()?;
    Some(epoch_ms(modified))
}

pub(super) fn epoch_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// Whether `path`, or the nearest of its ancestors that exists, is on a bpffs.
fn on_bpffs(path: &Path) -> bool {
    path.ancestors()
        .find(|ancestor| ancestor.exists())
        .and_then(|existing| rustix::fs::statfs(existing).ok())
        .is_some_and(|fs| fs.f_type as u64 == BPF_FS_MAGIC)
}

/// Mounts bpffs on /sys/fs/bpf when `pins` is under it and nothing is mounted there yet.
fn ensure_bpffs(pins: &Path) -> Result<(), PinError> {
    let mount = Path::new(BPF_FS_MOUNT);
    if !pins.starts_with(mount) || on_bpffs(mount) {
        return Ok(());
    }
    rustix::mount::mount(
        "bpf",
        mount,
        "bpf",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .map_err(|error| PinError::Mount(error.into()))?;
    tracing::warn!(
        "mounted bpffs on {BPF_FS_MOUNT}, where none was (systemd mounts it at boot): the \
         pins last as long as this mount"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_named_by_its_object_and_constants() {
        let name = set_name(b"object", 4026531836);
        assert_eq!(name, set_name(b"object", 4026531836), "stable");
        assert_ne!(name, set_name(b"objecT", 4026531836), "another object");
        assert_ne!(
            name,
            set_name(b"object", 4026532000),
            "another PID namespace"
        );
        assert_eq!(name.len(), 16);
        // The same across builds: a daemon restarted on a rebuilt binary adopts its pins.
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_directory_off_bpffs_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let pins = dir.path().join("pins");
        let state_pins = StatePins {
            dir: pins.clone(),
            owner: dir.path().into(),
        };
        match PinSet::open(&state_pins, "0123456789abcdef") {
            Err(PinError::NotBpffs(path)) => assert_eq!(path, pins),
            other => panic!("expected NotBpffs, got {other:?}"),
        }
        assert!(!pins.exists(), "nothing is created off bpffs");
    }

    #[test]
    fn each_state_directory_has_its_own_pins() {
        let root = Path::new("/sys/fs/bpf/liveness");
        let one = StatePins::of(root, Path::new("/nonexistent/a"));
        let other = StatePins::of(root, Path::new("/nonexistent/b"));
        assert_ne!(one.dir, other.dir);
        assert!(one.dir.starts_with(root));
        assert_eq!(one, StatePins::of(root, Path::new("/nonexistent/a")));
        assert_eq!(one.owner, Path::new("/nonexistent/a"));
    }

    #[test]
    fn only_a_directory_whose_owner_record_matches_its_name_has_a_known_owner() {
        let root = tempfile::tempdir().unwrap();
        let owner = Path::new("/nonexistent/state");
        let pins = StatePins::of(root.path(), owner);
        fs::create_dir(&pins.dir).unwrap();
        assert!(owner_of(&pins.dir).unwrap_err().contains("no owner record"));
        std::os::unix::fs::symlink(owner, pins.dir.join(OWNER)).unwrap();
        assert_eq!(owner_of(&pins.dir).unwrap(), owner);

        // Another state directory's record, a relative one, a link in place of a
        // directory, and junk: none is trusted.
        let other = root.path().join(state_dir_name(Path::new("/elsewhere")));
        fs::create_dir(&other).unwrap();
        std::os::unix::fs::symlink(owner, other.join(OWNER)).unwrap();
        assert!(owner_of(&other).unwrap_err().contains("does not match"));
        let relative = root.path().join(state_dir_name(Path::new("state")));
        fs::create_dir(&relative).unwrap();
        std::os::unix::fs::symlink("state", relative.join(OWNER)).unwrap();
        assert!(owner_of(&relative).unwrap_err().contains("does not match"));
        let link = root.path().join("state-0000000000000000");
        std::os::unix::fs::symlink(&pins.dir, &link).unwrap();
        assert!(owner_of(&link).unwrap_err().contains("symbolic link"));
        let junk = root.path().join("junk");
        fs::write(&junk, "x").unwrap();
        assert!(owner_of(&junk).unwrap_err().contains("state-"));
    }
}
