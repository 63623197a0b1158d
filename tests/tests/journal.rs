//! The journal: a death is appended to it before it is published, and written to SQLite
//! after. A SIGKILL at any point between loses nothing and duplicates nothing: after the
//! append (not published yet), after the publish (not in SQLite yet), and during the
//! replay of the journal at the next start; nor the cause and usage the death carried.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use integration_tests::{Conn, Daemon, Orphan, binary, eventually, privileged};
use serde_json::{Value, json};

/// The state directory kept across the daemons of a test (the daemon makes it 0700).
struct StateDir(std::path::PathBuf);

impl StateDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

/// A daemon that SIGKILLs itself at `point` (see liveness-daemon's `faults`), on `state`.
fn dying_at(point: &str, state: &Path) -> Daemon {
    let fault = format!("LIVENESS_FAULT={point}");
    Daemon::start_under(
        &["env", &fault],
        Some(state.to_owned()),
        &["--sources", "ebpf"],
    )
}

/// Registers session `s` owned by an orphan, which then exits with 3 (kept until the
/// test ends: dropping it kills what is left of it).
fn owner_dies(daemon: &Daemon) -> Orphan {
    let mut owner = Orphan::spawn(&["exit", "3"]);
    let reply =
        daemon.request(json!({"op": "register", "session": "s", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    owner.release();
    owner
}

/// Registers sessions `s0..sN`, each owned by an orphan that exits with 3 once released.
fn register_owners(daemon: &Daemon, count: usize) -> Vec<Orphan> {
    (0..count)
        .map(|i| {
            let owner = Orphan::spawn(&["exit", "3"]);
            let reply = daemon.request(
                json!({"op": "register", "session": format!("s{i}"), "owner": {"pid": owner.pid}}),
            );
            assert_eq!(reply["ok"], true, "{reply}");
            owner
        })
        .collect()
}

/// Waits for the daemon to be SIGKILLed by its fault point.
fn killed(daemon: &mut Daemon) {
    assert!(
        eventually(Duration::from_secs(20), || daemon.exited().is_some()),
        "the daemon did not die at its fault point:\n{}",
        daemon.log()
    );
    use std::os::unix::process::ExitStatusExt;
    let status = daemon.exited().expect("exited");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{}", daemon.log());
}

/// Every event of `subscribe` (a subscription from the start) up to the head it acks,
/// and the stream to read what follows.
fn replay(daemon: &Daemon, subscribe: Value) -> (Vec<Value>, Conn) {
    let mut stream = daemon.connect();
    let ack = stream.request(subscribe);
    assert_eq!(ack["ok"], true, "{ack}");
    let head = ack["subscribed"]["head"].as_u64().expect("head");
    let mut events = Vec::new();
    let mut seen = 0;
    while seen < head {
        let Some(line) = stream.next_within(Duration::from_secs(5)) else {
            break;
        };
        seen = line["event"]["seq"].as_u64().unwrap_or(seen);
        events.push(line["event"].clone());
    }
    (events, stream)
}

/// Every `session.ended` of session `s` in a replay from the start.
fn endings(daemon: &Daemon) -> Vec<Value> {
    let subscribe = json!({"op": "subscribe", "since": 0, "session": "s"});
    let (events, _) = replay(daemon, subscribe);
    events
        .into_iter()
        .filter(|event| event["kind"] == "session.ended")
        .collect()
}

/// The session, once ended, as it was ended by the death the eBPF source saw (not found
/// dead by a reconcile at start), exactly once: with the cause and the usage the kernel's
/// record carried, which only the journal kept across the kill.
fn ended_once_as_observed(daemon: &Daemon) {
    let ended = endings(daemon);
    assert_eq!(ended.len(), 1, "one ending: {ended:?}");
    assert_eq!(ended[0]["detected_by"], "ebpf", "{}", ended[0]);
    assert_eq!(ended[0]["exit"], json!({"kind": "exited", "code": 3}));
    assert_eq!(ended[0]["cause"], json!({"kind": "exit", "code": 3}));
    assert!(
        ended[0]["usage"]["peak_rss_bytes"].as_u64() > Some(0),
        "the kernel's usage: {}",
        ended[0]
    );
    let session = daemon.session("s");
    assert_eq!(session["phase"], "ended", "{session}");
    assert_eq!(session["detected_by"], "ebpf", "{session}");
    assert_eq!(session["cause"], ended[0]["cause"], "{session}");
    assert_eq!(session["usage"], ended[0]["usage"], "{session}");
}

#[test]
fn a_kill_after_the_append_publishes_the_death_once_at_the_next_start() {
    if !privileged("a_kill_after_the_append_publishes_the_death_once_at_the_next_start") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let state = StateDir(dir.path().join("state"));
    let mut daemon = dying_at("after-append", state.path());
    let mut live = daemon.connect();
    assert_eq!(live.request(json!({"op": "subscribe"}))["ok"], true);
    let _owner = owner_dies(&daemon);
    killed(&mut daemon);
    while let Some(line) = live.next_line() {
        assert_ne!(
            line["event"]["kind"], "session.ended",
            "published before it died: {line}"
        );
    }
    let daemon = Daemon::start_with_state(Some(state.path().to_owned()), &["--sources", "ebpf"]);
    ended_once_as_observed(&daemon);
}

#[test]
fn a_kill_after_the_publish_keeps_the_event_as_published_once() {
    if !privileged("a_kill_after_the_publish_keeps_the_event_as_published_once") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let state = StateDir(dir.path().join("state"));
    let mut daemon = dying_at("after-publish", state.path());
    let mut live: Conn = daemon.connect();
    assert_eq!(live.request(json!({"op": "subscribe"}))["ok"], true);
    let _owner = owner_dies(&daemon);
    killed(&mut daemon);
    let mut published = Vec::new();
    while let Some(line) = live.next_line() {
        if line["event"]["kind"] == "session.ended" {
            published.push(line["event"].clone());
        }
    }
    let daemon = Daemon::start_with_state(Some(state.path().to_owned()), &["--sources", "ebpf"]);
    ended_once_as_observed(&daemon);
    let replayed = endings(&daemon);
    for event in &published {
        assert_eq!(
            event, &replayed[0],
            "the event replayed is the one published"
        );
    }
}

#[test]
fn a_kill_during_the_journals_replay_replays_it_again_once() {
    if !privileged("a_kill_during_the_journals_replay_replays_it_again_once") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let state = StateDir(dir.path().join("state"));
    let mut daemon = dying_at("after-publish", state.path());
    let _owner = owner_dies(&daemon);
    killed(&mut daemon);
    // A start that dies while it replays the journal.
    let status = Command::new("env")
        .arg("LIVENESS_FAULT=mid-replay")
        .arg(binary("livenessd"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--state-dir")
        .arg(state.path())
        .status()
        .expect("run livenessd");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "died replaying the journal"
    );
    let daemon = Daemon::start_with_state(Some(state.path().to_owned()), &["--sources", "ebpf"]);
    ended_once_as_observed(&daemon);
}

/// Deaths published in a row wait for SQLite while more deaths are ready: a plain SIGKILL
/// right after their events were seen, whether or not SQLite has them yet, loses none and
/// repeats none, and the seqs go on after them.
#[test]
fn a_kill_right_after_deaths_in_a_row_were_published_keeps_each_once() {
    if !privileged("a_kill_right_after_deaths_in_a_row_were_published_keeps_each_once") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let state = StateDir(dir.path().join("state"));
    let mut daemon =
        Daemon::start_with_state(Some(state.path().to_owned()), &["--sources", "ebpf"]);
    let mut live = daemon.connect();
    assert_eq!(live.request(json!({"op": "subscribe"}))["ok"], true);
    let mut owners = register_owners(&daemon, 3);
    for owner in &mut owners {
        owner.release();
    }
    let mut published = Vec::new();
    while published.len() < 3 {
        let line = live
            .next_within(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("3 endings published: {published:?}\n{}", daemon.log()));
        if line["event"]["kind"] == "session.ended" {
            published.push(line["event"].clone());
        }
    }
    daemon.kill9();

    let daemon = Daemon::start_with_state(Some(state.path().to_owned()), &["--sources", "ebpf"]);
    let (replayed, mut stream) = replay(&daemon, json!({"op": "subscribe", "since": 0}));
    let head = replayed
        .last()
        .and_then(|e| e["seq"].as_u64())
        .expect("a head");
    let ended: Vec<&Value> = replayed
        .iter()
        .filter(|event| event["kind"] == "session.ended")
        .collect();
    assert_eq!(
        ended,
        published.iter().collect::<Vec<_>>(),
        "each published ending kept once, as published"
    );
    let seqs: Vec<u64> = replayed.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(
        seqs,
        (1..=head).collect::<Vec<_>>(),
        "every seq once, no gap"
    );
    for i in 0..3 {
        assert_eq!(daemon.session(&format!("s{i}"))["phase"], "ended");
    }
    let owner = Orphan::spawn(&["exit", "3"]);
    let reply =
        daemon.request(json!({"op": "register", "session": "after", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    let next = stream
        .next_within(Duration::from_secs(5))
        .expect("the registration's event");
    assert_eq!(next["event"]["seq"].as_u64(), Some(head + 1), "{next}");
}

/// The offsets of the journal's entries: each is its length (`u32`, little-endian), its
/// checksum, then its bytes; a zero length ends them.
fn entry_offsets(journal: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while let Some(header) = journal.get(at..at + 4) {
        let len = u32::from_le_bytes(header.try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        offsets.push(at);
        at += 8 + len;
    }
    offsets
}

/// Deaths on a full disk are only in the journal, published; the daemon is killed, and one
/// byte of the middle entry flips. It is damage, not a torn append (entries after it
/// read): the daemon refuses to start, naming `--recover`, and changes nothing. With
/// `--recover` every seq published keeps its event: the damaged entry's session is ended
/// again by the reconcile, under a seq above every one published, never one of theirs.
#[test]
fn a_damaged_middle_entry_is_refused_and_recovered_without_renumbering_published_seqs() {
    if !privileged("a_damaged_middle_entry_is_refused_and_recovered_without_renumbering") {
        return;
    }
    let fs = integration_tests::SmallFs::mount("4m");
    let state = fs.path().join("state");
    let mut daemon = Daemon::start_with_state(Some(state.clone()), &["--sources", "ebpf"]);
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    let mut owners = register_owners(&daemon, 3);
    let filler = fs.fill();
    // One death at a time: an entry each, published, which the database cannot take.
    let mut published = Vec::new();
    for (i, owner) in owners.iter_mut().enumerate() {
        owner.release();
        let ended =
            stream.next_event_of("session.ended", &format!("s{i}"), Duration::from_secs(10));
        published.push((ended["seq"].as_u64().unwrap(), format!("s{i}")));
    }
    let status = daemon.request(json!({"op": "status"}));
    assert_eq!(status["status"]["store"]["waiting"], 3, "{status}");
    daemon.kill9();
    std::fs::remove_file(filler).unwrap();

    let path = state.join("journal");
    let mut journal = std::fs::read(&path).unwrap();
    let offsets = entry_offsets(&journal);
    assert_eq!(offsets.len(), 3, "an entry per death");
    journal[offsets[1] + 40] ^= 0x01;
    std::fs::write(&path, &journal).unwrap();

    let stderr = integration_tests::refused_start(&state, &["--sources", "ebpf"]);
    assert!(
        stderr.contains("journal") && stderr.contains("damaged") && stderr.contains("--recover"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), journal, "left as it was");

    let recovered =
        Daemon::start_with_state(Some(state.clone()), &["--sources", "ebpf", "--recover"]);
    assert!(
        recovered.log().contains("recovered the damaged journal"),
        "{}",
        recovered.log()
    );
    let kept = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("journal.damaged-")
        });
    assert!(kept, "the damaged journal is kept aside");
    let (events, _) = replay(&recovered, json!({"op": "subscribe", "since": 0}));
    let by_seq = |seq: u64| events.iter().find(|e| e["seq"] == seq);
    let highest = published.iter().map(|(seq, _)| *seq).max().unwrap();
    for (seq, session) in &published {
        match by_seq(*seq) {
            // The damaged entry's event is lost; its seq is never given to another event.
            None => assert_eq!(session, "s1", "only the damaged entry's event is lost"),
            Some(event) => {
                assert_eq!(event["session"], session.as_str(), "seq {seq}: {event}");
                assert_eq!(event["kind"], "session.ended", "{event}");
            }
        }
    }
    assert!(
        by_seq(published[1].0).is_none(),
        "the damaged entry's seq stays unused"
    );
    let again: Vec<&Value> = events
        .iter()
        .filter(|e| e["session"] == "s1" && e["kind"] == "session.ended")
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0]["seq"].as_u64() > Some(highest), "{}", again[0]);
    assert_eq!(again[0]["detected_by"], "reconcile", "{}", again[0]);
    for i in 0..3 {
        assert_eq!(recovered.session(&format!("s{i}"))["phase"], "ended");
    }
}
