//! The journal: what a batch of deaths changed, appended to a file of its own before the
//! batch is published, and applied to SQLite right after. A death's durable step is that
//! one append, not a multi-page SQLite transaction; a daemon killed between the append and
//! the SQLite commit replays the journal at its next start.
//!
//! Each entry is framed as its length and a CRC-32 of its bytes, both little-endian `u32`,
//! then the bytes (JSON); a zero length ends the entries. A crash in the middle of an
//! append leaves a torn last entry, which fails its checksum or has no length yet: it is
//! cut off at the next start, as if never written, which it was not as far as anyone knows
//! (nothing is published before its append returned). Only the last entry can be torn: an
//! entry that fails its checksum with a whole entry after it is damage, and its deaths were
//! published. The journal is then refused, left as it is, until `livenessd --recover` keeps
//! every entry that reads (see [`recover`]): cutting it there would drop the entries after
//! it too, and their seqs would be handed out again for other events.
//!
//! Where the filesystem allows it (ext4, XFS, tmpfs), the file's space is reserved ahead
//! (`fallocate`) and mapped shared, and an append is a copy into the page cache: no system
//! call on a death's way. The entry's bytes go first and its length last, so that an
//! append cut short is never read. Elsewhere (copy-on-write filesystems, where a store into
//! a mapping can fail with `SIGBUS` when the disk is full) each append is one `write(2)`.
//!
//! Durability is SQLite's with `synchronous=NORMAL`: an append survives the daemon's
//! crash or SIGKILL (it is in the page cache either way); a power loss may lose the newest
//! ones, which the reconcile at start makes good (see the store's `begin_run`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use liveness_common::cause::{Cause, Usage};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::session::{EndReason, Event, Phase, Session, Survivors};

/// The journal's file name in the state directory.
pub const FILE_NAME: &str = "journal";
/// Once every entry is applied, a file appended with `write(2)` is emptied when it is at
/// least this big. A mapped one is zeroed after every apply: its pages stay writable.
const COMPACT_BYTES: u64 = 1 << 20;
/// The space a mapped journal reserves at first; an entry that does not fit doubles it.
const RESERVED: usize = 1 << 20;
/// An entry bigger than this is damage, not an entry (a burst of 1,024 endings with their
/// survivors lists stays far below).
const MAX_ENTRY: usize = 256 << 20;

/// One event as the `events` table keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledEvent {
    pub seq: u64,
    pub kind: String,
    pub session: String,
    pub creator_uid: u32,
    pub at_ms: i64,
    pub body: EventJson,
}

/// An event's JSON, as the `events` table keeps it and a subscriber's line embeds it.
/// Serialized once per event: an entry holds it as JSON, not as a string of it, so it is
/// neither escaped in the append nor written again for the stream.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct EventJson(Box<RawValue>);

impl EventJson {
    pub fn of(event: &Event) -> serde_json::Result<EventJson> {
        serde_json::value::to_raw_value(event).map(EventJson)
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl From<Box<RawValue>> for EventJson {
    fn from(raw: Box<RawValue>) -> EventJson {
        EventJson(raw)
    }
}

impl PartialEq for EventJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for EventJson {}

impl<'de> Deserialize<'de> for EventJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        if !raw.get().starts_with('"') {
            return Ok(EventJson(raw));
        }
        // A journal written before kept each body as a string of JSON.
        let text: String = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
        RawValue::from_string(text)
            .map(EventJson)
            .map_err(D::Error::custom)
    }
}

/// One session a death ended, as its row is updated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledEnding {
    pub uid: u32,
    pub id: String,
    pub reason: EndReason,
    pub exit: Option<ExitStatus>,
    pub detected_by: Option<DetectedBy>,
    pub ended_ms: i64,
    pub survivors: Option<Survivors>,
    /// Why its owner died, as this session's readers may see it (a journal written before
    /// causes were recorded has none).
    #[serde(default)]
    pub cause: Option<Cause>,
    /// What its owner cost.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Its processes are to be terminated (its policy, or `end --terminate`).
    pub reap: bool,
}

impl JournaledEnding {
    /// Ends `session` as this ending does its row (see `Store::apply`): how a read shows a
    /// session whose end is published but not yet in the database.
    pub fn end(&self, session: &mut Session) {
        if session.phase != Phase::Active {
            return;
        }
        session.phase = Phase::Ended;
        session.reason = Some(self.reason);
        session.exit = self.exit;
        session.detected_by = self.detected_by;
        session.ended_ms = Some(self.ended_ms);
        session.updated_ms = self.ended_ms;
        if self.survivors.is_some() {
            session.survivors.clone_from(&self.survivors);
        }
        session.cause.clone_from(&self.cause);
        session.usage.clone_from(&self.usage);
    }

    /// Whether it ends user `uid`'s session `id`.
    pub fn ends(&self, uid: u32, id: &str) -> bool {
        self.uid == uid && self.id == id
    }
}

/// A lock a death released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledRelease {
    pub uid: u32,
    pub name: String,
    pub session: String,
}

/// What one batch of deaths changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub endings: Vec<JournaledEnding>,
    pub released: Vec<JournaledRelease>,
    /// Its events, in seq order.
    pub events: Vec<JournaledEvent>,
}

impl JournalEntry {
    /// The seq of its last event.
    pub fn last_seq(&self) -> Option<u64> {
        self.events.last().map(|event| event.seq)
    }
}

/// Why the journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "the journal {path} is damaged: the entry at byte {at} fails its checksum, and \
         entries after it read, so it is no torn last append; its deaths were published. It \
         was left as it is. Run `livenessd --recover` with the same flags to keep every entry \
         that reads (the sessions of the damaged one are ended again, under new seqs) and \
         set the file aside"
    )]
    Damaged { path: PathBuf, at: usize },
    #[error("an entry of the journal {path} cannot be written: {source}")]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// The journal file, open for appending.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    /// Bytes of entries in the file; what follows, if anything, is zeros.
    len: u64,
    /// The frame of the last append, kept to spare an allocation per death.
    frame: Vec<u8>,
    /// The file's reserved space, where the filesystem allows a mapping.
    mapped: Option<Mapping>,
    /// Tests: every append fails (see [`Journal::fail_appends`]).
    #[cfg(test)]
    failing: bool,
}

impl Journal {
    /// Opens (or creates) the journal in `dir` and reads its entries. A torn last entry is
    /// cut off; the next append follows the entries read.
    pub fn open(dir: &Path) -> Result<(Journal, Vec<JournalEntry>), JournalError> {
        Journal::open_with(dir, true)
    }

    /// [`Journal::open`]; with `may_map` false, each append is a `write(2)` wherever the
    /// file is (tests take both ways).
    fn open_with(dir: &Path, may_map: bool) -> Result<(Journal, Vec<JournalEntry>), JournalError> {
        let path = dir.join(FILE_NAME);
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            // Its entries are read first; what follows them is cut below.
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let Scan {
            entries,
            end: valid,
            skipped,
            ..
        } = scan(&bytes);
        if let Some(damage) = skipped.first() {
            return Err(JournalError::Damaged {
                path,
                at: damage.start,
            });
        }
        if bytes[valid..].iter().any(|&b| b != 0) {
            tracing::warn!(
                path = %path.display(),
                cut = bytes.len() - valid,
                "the journal ends in a torn entry (a crash during its append): it is cut off"
            );
        }
        // What follows the entries reads as zeros from now on.
        file.set_len(valid as u64).map_err(io)?;
        let mapped = if may_map && mappable(&file) {
            Mapping::reserve(&file, valid + 1)
                .inspect_err(|e| {
                    // An ext4 without extents cannot reserve; a full disk cannot now.
                    tracing::warn!(path = %path.display(), error = %e, "the journal cannot reserve its space: each append is a write(2) until the next start");
                })
                .ok()
        } else {
            None
        };
        let journal = Journal {
            path,
            file,
            len: valid as u64,
            frame: Vec::new(),
            mapped,
            #[cfg(test)]
            failing: false,
        };
        Ok((journal, entries))
    }

    /// How many bytes its entries take (a mapped file is bigger: its space is reserved).
    pub fn entry_bytes(&self) -> u64 {
        self.len
    }

    /// Makes every append fail until turned off again: how tests reach what callers do
    /// when the journal cannot be written.
    #[cfg(test)]
    pub fn fail_appends(&mut self, fail: bool) {
        self.failing = fail;
    }

    /// Appends `entry`: one copy into the mapped file, or one write.
    pub fn append(&mut self, entry: &JournalEntry) -> Result<(), JournalError> {
        #[cfg(test)]
        if self.failing {
            return Err(JournalError::Io {
                path: self.path.clone(),
                source: io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        self.frame.clear();
        self.frame.extend_from_slice(&[0; 8]);
        serde_json::to_writer(&mut self.frame, entry).map_err(|source| JournalError::Encode {
            path: self.path.clone(),
            source,
        })?;
        let payload = &self.frame[8..];
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        let crc = crc32(payload);
        self.frame[..4].copy_from_slice(&len.to_le_bytes());
        self.frame[4..8].copy_from_slice(&crc.to_le_bytes());
        let at = self.len as usize;
        let written = match &mut self.mapped {
            Some(mapped) => {
                // One zero byte stays after the entry: the next one's length, until written.
                let needed = at + self.frame.len() + 1;
                if needed > mapped.len {
                    mapped.grow(&self.file, needed)
                } else {
                    Ok(())
                }
                .map(|()| mapped.put(at, &self.frame))
            }
            None => self
                .file
                .write_all_at(&self.frame, self.len)
                .inspect_err(|_| {
                    // Whatever part of the frame was written is a torn entry: cut it off now,
                    // so that the next append is not read as its continuation.
                    let _ = self.file.set_len(self.len);
                }),
        };
        written.map_err(|source| JournalError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.len += self.frame.len() as u64;
        Ok(())
    }

    /// Empties the journal, every entry being applied to SQLite by now: a mapped one at
    /// once (zeroing a few pages that stay writable), a written one once it is big.
    pub fn compact(&mut self) -> Result<(), JournalError> {
        if self.mapped.is_none() && self.len < COMPACT_BYTES {
            return Ok(());
        }
        self.clear()
    }

    /// Empties the journal, every entry being applied to SQLite by now.
    pub fn clear(&mut self) -> Result<(), JournalError> {
        match &mut self.mapped {
            Some(mapped) => mapped.zero(self.len as usize),
            None => self.file.set_len(0).map_err(|source| JournalError::Io {
                path: self.path.clone(),
                source,
            })?,
        }
        self.len = 0;
        Ok(())
    }
}

/// Whether a store into a mapping of `file`'s reserved space cannot fail: on a filesystem
/// that writes in place. A copy-on-write one needs new space for each write back, and a
/// full disk would kill the daemon with `SIGBUS` in the middle of a copy.
fn mappable(file: &File) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const TMPFS: i64 = 0x0102_1994;
    rustix::fs::fstatfs(file).is_ok_and(|fs| {
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        let kind = fs.f_type as i64;
        matches!(kind, EXT4 | XFS | TMPFS)
    })
}

/// The journal file's reserved space, mapped shared: what is copied here is in the page
/// cache, as a `write(2)` would have put it.
#[derive(Debug)]
struct Mapping {
    at: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is this value's alone; it is written only through `&mut self`.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Reserves `len` bytes of `file` (allocated now: a full disk fails here, never in a
    /// store) and maps them.
    fn reserve(file: &File, len: usize) -> io::Result<Mapping> {
        let len = len.next_multiple_of(RESERVED);
        rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len as u64)?;
        // SAFETY: a new shared mapping of `len` bytes of a file that has them (allocated
        // just now); nothing else in the process maps it.
        let at = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                file,
                0,
            )?
        };
        let at = NonNull::new(at.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { at, len })
    }

    /// Makes room for `needed` bytes: reserves more of the file and maps it anew.
    fn grow(&mut self, file: &File, needed: usize) -> io::Result<()> {
        let bigger = Mapping::reserve(file, needed.max(self.len * 2))?;
        // The old mapping goes with the value replaced.
        *self = bigger;
        Ok(())
    }

    /// Copies `frame` to `at`: its entry's bytes, then its length and checksum, so that a
    /// copy cut short leaves a zero length, which ends the entries.
    fn put(&mut self, at: usize, frame: &[u8]) {
        let (header, payload) = frame.split_at(8);
        let space = self.bytes();
        space[at + 8..at + frame.len()].copy_from_slice(payload);
        space[at..at + 8].copy_from_slice(header);
    }

    /// Zeroes the first `len` bytes, the first length first.
    fn zero(&mut self, len: usize) {
        self.bytes()[..len].fill(0);
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped readable and writable at `at`, for as long as `self`
        // lives, and borrowed mutably from it.
        unsafe { std::slice::from_raw_parts_mut(self.at.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps what `reserve` mapped; no slice of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.at.as_ptr().cast(), self.len) };
    }
}

/// What a journal's bytes hold.
#[derive(Debug, Default)]
struct Scan {
    /// Every entry that reads, in order.
    entries: Vec<JournalEntry>,
    /// Where each of them starts.
    offsets: Vec<usize>,
    /// Where the last of them ends: what follows is zeros, or a torn append.
    end: usize,
    /// Damage: the bytes between entries that read, where no entry does.
    skipped: Vec<std::ops::Range<usize>>,
}

/// Reads every entry framed in `bytes`: from the start, one after the other; where one does
/// not read, from the next offset where one does, if any (then the bytes skipped are damage).
fn scan(bytes: &[u8]) -> Scan {
    let mut scan = Scan::default();
    let mut at = 0;
    loop {
        if let Some((entry, len)) = frame_at(bytes, at) {
            scan.entries.push(entry);
            scan.offsets.push(at);
            at += len;
            scan.end = at;
            continue;
        }
        // A frame ends in its JSON's last byte, never zero: none starts in the zeros at the
        // end (the reserved space). Its length is little-endian and below 2^28, and JSON is
        // printable: JSON's bytes never pass for a header, so few offsets are looked at
        // closely.
        let last = bytes.iter().rposition(|&b| b != 0).unwrap_or(0);
        match (at + 1..last.saturating_sub(8)).find(|&from| frame_at(bytes, from).is_some()) {
            Some(next) => {
                scan.skipped.push(at..next);
                at = next;
            }
            None => return scan,
        }
    }
}

/// The entry framed at `at`, and the frame's length, if a whole one is there.
fn frame_at(bytes: &[u8], at: usize) -> Option<(JournalEntry, usize)> {
    let header = bytes.get(at..at.checked_add(8)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().ok()?);
    if len == 0 || len > MAX_ENTRY {
        return None;
    }
    let payload = bytes.get(at + 8..at + 8 + len)?;
    if crc32(payload) != crc {
        return None;
    }
    let entry = serde_json::from_slice(payload).ok()?;
    Some((entry, 8 + len))
}

/// What [`recover`] did to a damaged journal.
#[derive(Debug)]
pub struct RecoveredJournal {
    /// Where the damaged journal was kept.
    pub aside: PathBuf,
    /// The entries kept, every one that reads.
    pub entries: usize,
    /// The damaged bytes, by offset in the kept file.
    pub skipped: Vec<std::ops::Range<usize>>,
    /// The seqs of the events that were in the damaged entries, as far as their neighbours
    /// tell (from the one after the last seq before to the one before the first after).
    pub lost_seqs: Vec<(u64, u64)>,
}

/// `livenessd --recover`: a damaged journal in `dir` is kept aside (`journal.damaged-<unix
/// time>`) and replaced by one of every entry that reads, in order, so that their deaths are
/// applied with the seqs they were published with, and the seqs after them continue above
/// every one published. The sessions of the damaged entries are still active in the
/// database, and the reconcile at start ends them again under new seqs. Does nothing to an
/// intact journal (a torn last append is cut at open, as always).
pub fn recover(dir: &Path) -> Result<Option<RecoveredJournal>, JournalError> {
    let path = dir.join(FILE_NAME);
    let io = |source| JournalError::Io {
        path: path.clone(),
        source,
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let scan = scan(&bytes);
    if scan.skipped.is_empty() {
        return Ok(None);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = dir.join(format!("{FILE_NAME}.damaged-{stamp}"));
    std::fs::rename(&path, &aside).map_err(io)?;
    let lost_seqs = scan
        .skipped
        .iter()
        .map(|range| {
            let split = scan.offsets.partition_point(|&offset| offset < range.start);
            let before = scan.entries[..split]
                .iter()
                .rev()
                .find_map(JournalEntry::last_seq)
                .unwrap_or(0);
            let after = scan.entries[split..]
                .iter()
                .find_map(|entry| entry.events.first().map(|event| event.seq))
                .unwrap_or(u64::MAX);
            (before + 1, after.saturating_sub(1))
        })
        .collect();
    let (mut journal, _) = Journal::open_with(dir, false)?;
    for entry in &scan.entries {
        journal.append(entry)?;
    }
    journal.file.sync_all().map_err(io)?;
    Ok(Some(RecoveredJournal {
        aside,
        entries: scan.entries.len(),
        skipped: scan.skipped,
        lost_seqs,
    }))
}

/// CRC-32 (IEEE 802.3, as zlib computes it).
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut n = 0;
        while n < 256 {
            let mut c = n as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[n] = c;
            n += 1;
        }
        table
    };
    !bytes.iter().fold(!0u32, |crc, &b| {
        TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64) -> JournalEntry {
        JournalEntry {
            endings: vec![JournaledEnding {
                uid: 1000,
                id: format!("s{seq}"),
                reason: EndReason::OwnerExited,
                exit: Some(ExitStatus::Exited { code: 3 }),
                detected_by: Some(DetectedBy::Ebpf),
                ended_ms: 7,
                survivors: None,
                cause: Some(Cause::Signal {
                    signal: 15,
                    sender: None,
                    kernel: None,
                }),
                usage: None,
                reap: false,
            }],
            released: vec![JournaledRelease {
                uid: 1000,
                name: "build".into(),
                session: format!("s{seq}"),
            }],
            events: vec![JournaledEvent {
                seq,
                kind: "session.ended".into(),
                session: format!("s{seq}"),
                creator_uid: 1000,
                at_ms: 7,
                body: EventJson(RawValue::from_string(format!(r#"{{"seq":{seq}}}"#)).unwrap()),
            }],
        }
    }

    /// A body is written as the event's JSON itself, and a journal of an earlier version,
    /// which held it as a string of JSON, reads back the same.
    #[test]
    fn bodies_are_json_and_string_bodies_of_earlier_journals_still_read() {
        let written = serde_json::to_value(entry(4)).unwrap();
        assert_eq!(written["events"][0]["body"], serde_json::json!({"seq": 4}));
        let mut earlier = written.clone();
        earlier["events"][0]["body"] = serde_json::json!(r#"{"seq":4}"#);
        let read: JournalEntry = serde_json::from_value(earlier.clone()).unwrap();
        assert_eq!(read, entry(4));
        let read: JournalEntry =
            serde_json::from_slice(&serde_json::to_vec(&earlier).unwrap()).unwrap();
        assert_eq!(read, entry(4));
    }

    #[test]
    fn the_checksum_is_zlibs() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    /// Mapped, then written.
    const MODES: [bool; 2] = [true, false];

    /// A directory where a journal is mapped: `/dev/shm` (tmpfs), or the temporary
    /// directory where there is none (as in the test VMs, whose `/tmp` is tmpfs). Not the
    /// temporary directory first: in a container it is on an overlay, which is not mapped.
    fn mapped_dir() -> tempfile::TempDir {
        [std::path::PathBuf::from("/dev/shm"), std::env::temp_dir()]
            .into_iter()
            .filter_map(|dir| tempfile::tempdir_in(dir).ok())
            .find(|dir| File::create(dir.path().join("probe")).is_ok_and(|f| mappable(&f)))
            .expect("/dev/shm or the temporary directory on ext4, XFS or tmpfs")
    }

    #[test]
    fn a_journal_on_a_filesystem_that_writes_in_place_is_mapped() {
        let dir = mapped_dir();
        let (journal, _) = Journal::open(dir.path()).unwrap();
        assert!(journal.mapped.is_some());
        let (journal, _) = Journal::open_with(dir.path(), false).unwrap();
        assert!(journal.mapped.is_none());
    }

    #[test]
    fn entries_come_back_in_order_after_a_reopen() {
        for mapped in MODES {
            let dir = mapped_dir();
            let (mut journal, found) = Journal::open_with(dir.path(), mapped).unwrap();
            assert!(found.is_empty());
            for seq in 1..=3 {
                journal.append(&entry(seq)).unwrap();
            }
            drop(journal);
            let (mut journal, found) = Journal::open_with(dir.path(), mapped).unwrap();
            assert_eq!(found, vec![entry(1), entry(2), entry(3)], "mapped {mapped}");
            // The next append follows them, whichever way the first ones were made.
            journal.append(&entry(4)).unwrap();
            drop(journal);
            let other = MODES.into_iter().find(|m| *m != mapped).unwrap();
            let (_, found) = Journal::open_with(dir.path(), other).unwrap();
            assert_eq!(found.len(), 4, "mapped {mapped}, then {other}");
        }
    }

    #[test]
    fn a_torn_last_entry_is_cut_off_and_the_next_append_follows_the_good_ones() {
        for mapped in MODES {
            let dir = mapped_dir();
            let path = dir.path().join(FILE_NAME);
            let (mut journal, _) = Journal::open_with(dir.path(), mapped).unwrap();
            journal.append(&entry(1)).unwrap();
            journal.append(&entry(2)).unwrap();
            drop(journal);
            let whole = std::fs::read(&path).unwrap();
            // Every cut of the second entry, as a crash (or a power loss) in its append
            // could leave it, with zeros after the cut where the space was reserved.
            let first = 8 + serde_json::to_vec(&entry(1)).unwrap().len();
            let second = first + 8 + serde_json::to_vec(&entry(2)).unwrap().len();
            for cut in first..second {
                let mut torn = whole[..cut].to_vec();
                torn.resize(whole.len(), 0);
                std::fs::write(&path, &torn).unwrap();
                let (mut journal, found) = Journal::open_with(dir.path(), mapped).unwrap();
                assert_eq!(found, vec![entry(1)], "mapped {mapped}, cut at {cut}");
                journal.append(&entry(3)).unwrap();
                drop(journal);
                let (_, found) = Journal::open_with(dir.path(), mapped).unwrap();
                assert_eq!(
                    found,
                    vec![entry(1), entry(3)],
                    "mapped {mapped}, cut at {cut}"
                );
            }
        }
    }

    /// A mapped append copies its entry before its length: cut short anywhere, it leaves a
    /// zero length, and the entries before it are all that is read.
    #[test]
    fn a_mapped_append_cut_before_its_length_is_not_read() {
        let dir = mapped_dir();
        let path = dir.path().join(FILE_NAME);
        let (mut journal, _) = Journal::open(dir.path()).unwrap();
        journal.append(&entry(1)).unwrap();
        let first = journal.len as usize;
        journal.append(&entry(2)).unwrap();
        drop(journal);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[first..first + 8].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let (_, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found, vec![entry(1)]);
    }

    /// One flipped byte in a middle entry, in its JSON or in its length: the entries after
    /// it read, so it is damage, not a torn append. The journal is refused and left as it
    /// is; `recover` keeps it aside and keeps every entry that reads, with its seqs.
    #[test]
    fn a_damaged_middle_entry_is_refused_until_recovered_with_every_entry_that_reads() {
        for mapped in MODES {
            for flipped in [12, 1] {
                let dir = mapped_dir();
                let path = dir.path().join(FILE_NAME);
                let (mut journal, _) = Journal::open_with(dir.path(), mapped).unwrap();
                for seq in 1..=3 {
                    journal.append(&entry(seq)).unwrap();
                }
                drop(journal);
                let mut bytes = std::fs::read(&path).unwrap();
                let second = 8 + serde_json::to_vec(&entry(1)).unwrap().len();
                bytes[second + flipped] ^= 0x40;
                std::fs::write(&path, &bytes).unwrap();

                let refused = Journal::open_with(dir.path(), mapped).unwrap_err();
                assert!(
                    matches!(refused, JournalError::Damaged { at, .. } if at == second),
                    "mapped {mapped}, byte {flipped}: {refused}"
                );
                assert!(
                    refused.to_string().contains("livenessd --recover"),
                    "{refused}"
                );
                assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it is");

                let recovered = recover(dir.path()).unwrap().expect("recovered");
                assert_eq!(recovered.entries, 2);
                assert_eq!(recovered.lost_seqs, [(2, 2)]);
                assert_eq!(
                    std::fs::read(&recovered.aside).unwrap(),
                    bytes,
                    "kept aside"
                );
                let (_, found) = Journal::open_with(dir.path(), mapped).unwrap();
                assert_eq!(found, vec![entry(1), entry(3)], "mapped {mapped}");
                assert!(recover(dir.path()).unwrap().is_none(), "intact now");
            }
        }
    }

    /// A damaged last entry cannot be told from a torn one: it is cut, as a torn one is.
    #[test]
    fn a_damaged_last_entry_is_cut_as_a_torn_one() {
        let dir = mapped_dir();
        let path = dir.path().join(FILE_NAME);
        let (mut journal, _) = Journal::open(dir.path()).unwrap();
        journal.append(&entry(1)).unwrap();
        journal.append(&entry(2)).unwrap();
        drop(journal);
        let mut bytes = std::fs::read(&path).unwrap();
        let second = 8 + serde_json::to_vec(&entry(1)).unwrap().len();
        bytes[second + 12] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert!(recover(dir.path()).unwrap().is_none());
        let (_, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found, vec![entry(1)]);
    }

    #[test]
    fn a_written_journal_is_emptied_by_compact_once_big() {
        let dir = mapped_dir();
        let (mut journal, _) = Journal::open_with(dir.path(), false).unwrap();
        journal.append(&entry(1)).unwrap();
        journal.compact().unwrap();
        assert!(journal.len > 0, "a small journal is left as it is");
        let mut seq = 2;
        while journal.len < COMPACT_BYTES {
            journal.append(&entry(seq)).unwrap();
            seq += 1;
        }
        journal.compact().unwrap();
        journal.append(&entry(seq)).unwrap();
        drop(journal);
        let (_, found) = Journal::open_with(dir.path(), false).unwrap();
        assert_eq!(found, vec![entry(seq)]);
    }

    /// Entries beyond the reserved space reserve more; compact empties a mapped journal
    /// at once, and what follows starts from its beginning.
    #[test]
    fn a_mapped_journal_grows_and_is_emptied_by_every_compact() {
        let dir = mapped_dir();
        let path = dir.path().join(FILE_NAME);
        let (mut journal, _) = Journal::open(dir.path()).unwrap();
        let mut seq = 0;
        while journal.len < 3 * RESERVED as u64 {
            seq += 1;
            journal.append(&entry(seq)).unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() >= 3 * RESERVED as u64);
        drop(journal);
        let (mut journal, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found.len() as u64, seq);
        assert!(found.iter().zip(1..).all(|(e, s)| *e == entry(s)));
        journal.compact().unwrap();
        journal.append(&entry(seq + 1)).unwrap();
        drop(journal);
        let (_, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found, vec![entry(seq + 1)]);
    }
}
