//! The journal: what a batch of deaths changed, appended to a file of its own in one
//! `write(2)` before the batch is published, and applied to SQLite right after. A death's
//! durable step is that one append, not a multi-page SQLite transaction; a daemon killed
//! between the append and the SQLite commit replays the journal at its next start.
//!
//! Each entry is framed as its length and a CRC-32 of its bytes, both little-endian `u32`,
//! then the bytes (JSON). A crash in the middle of an append leaves a torn last entry,
//! which fails its checksum: it is cut off at the next start, as if never written, which
//! it was not as far as anyone knows (nothing is published before its append returned).
//!
//! Durability is SQLite's with `synchronous=NORMAL`: an append survives the daemon's
//! crash or SIGKILL (it is in the page cache); a power loss may lose the newest ones, which
//! the reconcile at start makes good (see the store's `begin_run`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use liveness_common::cause::{Cause, Usage};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::session::{EndReason, Event, Survivors};

/// The journal's file name in the state directory.
pub const FILE_NAME: &str = "journal";
/// Once every entry is applied, the file is emptied when it is at least this big.
const COMPACT_BYTES: u64 = 1 << 20;
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
    /// Bytes in the file.
    len: u64,
    /// The frame of the last append, kept to spare an allocation per death.
    frame: Vec<u8>,
    /// Tests: every append fails (see [`Journal::fail_appends`]).
    #[cfg(test)]
    failing: bool,
}

impl Journal {
    /// Opens (or creates) the journal in `dir` and reads its entries. A torn last entry is
    /// cut off.
    pub fn open(dir: &Path) -> Result<(Journal, Vec<JournalEntry>), JournalError> {
        let path = dir.join(FILE_NAME);
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let (entries, valid) = read_entries(&bytes);
        if valid < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                cut = bytes.len() - valid,
                "the journal ends in a torn entry (a crash during its append): it is cut off"
            );
            file.set_len(valid as u64).map_err(io)?;
        }
        let journal = Journal {
            path,
            file,
            len: valid as u64,
            frame: Vec::new(),
            #[cfg(test)]
            failing: false,
        };
        Ok((journal, entries))
    }

    /// Makes every append fail until turned off again: how tests reach what callers do
    /// when the journal cannot be written.
    #[cfg(test)]
    pub fn fail_appends(&mut self, fail: bool) {
        self.failing = fail;
    }

    /// Appends `entry` in one write.
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
        if let Err(source) = self.file.write_all(&self.frame) {
            // Whatever part of the frame was written is a torn entry: cut it off now, so
            // that the next append is not read as its continuation.
            let _ = self.file.set_len(self.len);
            return Err(JournalError::Io {
                path: self.path.clone(),
                source,
            });
        }
        self.len += self.frame.len() as u64;
        Ok(())
    }

    /// Empties the file once it is big, every entry being applied to SQLite by now.
    pub fn compact(&mut self) -> Result<(), JournalError> {
        if self.len < COMPACT_BYTES {
            return Ok(());
        }
        self.clear()
    }

    /// Empties the file, every entry being applied to SQLite by now.
    pub fn clear(&mut self) -> Result<(), JournalError> {
        self.file.set_len(0).map_err(|source| JournalError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.len = 0;
        Ok(())
    }
}

/// The entries framed in `bytes`, and how many bytes they take: what follows is torn.
fn read_entries(bytes: &[u8]) -> (Vec<JournalEntry>, usize) {
    let mut entries = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().unwrap_or_default());
        let Some(payload) = bytes.get(at + 8..at + 8 + len).filter(|_| len <= MAX_ENTRY) else {
            break;
        };
        if crc32(payload) != crc {
            break;
        }
        match serde_json::from_slice(payload) {
            Ok(entry) => entries.push(entry),
            Err(_) => break,
        }
        at += 8 + len;
    }
    (entries, at)
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

    #[test]
    fn entries_come_back_in_order_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, found) = Journal::open(dir.path()).unwrap();
        assert!(found.is_empty());
        for seq in 1..=3 {
            journal.append(&entry(seq)).unwrap();
        }
        drop(journal);
        let (_, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found, vec![entry(1), entry(2), entry(3)]);
    }

    #[test]
    fn a_torn_last_entry_is_cut_off_and_the_next_append_follows_the_good_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let (mut journal, _) = Journal::open(dir.path()).unwrap();
        journal.append(&entry(1)).unwrap();
        journal.append(&entry(2)).unwrap();
        drop(journal);
        let whole = std::fs::read(&path).unwrap();
        // Every cut of the second entry, as a crash in its write could leave it.
        let first = 8 + serde_json::to_vec(&entry(1)).unwrap().len();
        for cut in first..whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (mut journal, found) = Journal::open(dir.path()).unwrap();
            assert_eq!(found, vec![entry(1)], "cut at {cut}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), first as u64);
            journal.append(&entry(3)).unwrap();
            drop(journal);
            let (_, found) = Journal::open(dir.path()).unwrap();
            assert_eq!(found, vec![entry(1), entry(3)], "cut at {cut}");
        }
    }

    #[test]
    fn a_damaged_entry_ends_what_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let (mut journal, _) = Journal::open(dir.path()).unwrap();
        for seq in 1..=3 {
            journal.append(&entry(seq)).unwrap();
        }
        drop(journal);
        let mut bytes = std::fs::read(&path).unwrap();
        let second = 8 + serde_json::to_vec(&entry(1)).unwrap().len();
        bytes[second + 12] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let (_, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found, vec![entry(1)]);
    }

    #[test]
    fn a_big_journal_is_emptied_by_compact() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(dir.path()).unwrap();
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
        let (_, found) = Journal::open(dir.path()).unwrap();
        assert_eq!(found, vec![entry(seq)]);
    }
}
