//! Fault injection: a full disk, SIGKILL in the middle of a burst of deaths, a ring buffer
//! that overflows, and garbage on the socket. `cargo xtask chaos` runs these with more
//! rounds and inputs (`LIVENESS_FAULT_ROUNDS`, `PROPTEST_CASES`).

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::{Conn, Daemon, Orphan, OrphanGroup, eventually, fault_rounds, privileged};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(1500);

/// A small tmpfs, mounted for the test's life (root only), so the disk can be filled
/// without touching the host's.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("size={size},mode=0700")).unwrap();
        // SAFETY: all pointers are NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        SmallFs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the file system is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // Whatever is left is less than one page: nothing more fits.
        let _ = file.write_all(&[0u8; 4096]);
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: detaching the mount this struct made.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn status(conn: &mut Conn) -> Value {
    let reply = conn.request(json!({"op": "status"}));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["status"].clone()
}

/// An owner dies while the database cannot grow: nothing is announced that was not
/// committed, the session stays ACTIVE, and once space is back the death is committed and
/// published exactly once, without a restart.
#[test]
fn a_death_on_a_full_disk_is_committed_once_space_returns() {
    if !privileged("a_death_on_a_full_disk_is_committed_once_space_returns") {
        return;
    }
    let fs = SmallFs::mount("4m");
    // eBPF reports the exit status of a process that is not the daemon's child.
    let daemon = Daemon::start_with_state(Some(fs.path().join("state")), &["--sources", "ebpf"]);
    let mut control = daemon.connect();
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    let mut owner = Orphan::spawn(&["exit", "3"]);
    let reply =
        control.request(json!({"op": "register", "session": "full", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    let registered = stream.next_within(ARRIVAL).expect("the registration event");
    assert_eq!(registered["event"]["kind"], "session.registered");

    let filler = fs.fill();
    owner.release();
    assert!(
        eventually(ARRIVAL, || status(&mut control)["uncommitted_deaths"] == 1),
        "the death was not held back: {}",
        status(&mut control)
    );
    assert!(
        stream.next_within(QUIET).is_none(),
        "an event was published that could not be committed"
    );
    let session = control.request(json!({"op": "get", "session": "full"}));
    assert_eq!(session["session"]["phase"], "active", "{session}");

    std::fs::remove_file(filler).expect("free the space");
    let ended = stream
        .next_within(ARRIVAL)
        .expect("the death is committed once space returns");
    assert_eq!(ended["event"]["kind"], "session.ended", "{ended}");
    assert_eq!(ended["event"]["reason"], "owner_exited", "{ended}");
    assert_eq!(ended["event"]["exit"], json!({"kind": "exited", "code": 3}));
    assert_ne!(ended["event"]["detected_by"], "reconcile", "{ended}");
    assert!(
        stream.next_within(QUIET).is_none(),
        "the session ended more than once"
    );
    let after = status(&mut control);
    assert_eq!(after["uncommitted_deaths"], 0, "{after}");
    assert!(
        after["counters"]["failed_commits"].as_u64() >= Some(1),
        "{after}"
    );
    let session = control.request(json!({"op": "get", "session": "full"}));
    assert_eq!(session["session"]["phase"], "ended", "{session}");
}

/// Owners that die together: enough that their endings span several commits.
const BURST: usize = 100;

/// Registers one session per member of `group`, named `{prefix}{i}`.
fn register_group(daemon: &Daemon, group: &OrphanGroup, prefix: &str) -> Vec<String> {
    let mut control = daemon.connect();
    group
        .members
        .iter()
        .enumerate()
        .map(|(i, &(pid, _))| {
            let session = format!("{prefix}{i}");
            let reply = control
                .request(json!({"op": "register", "session": session, "owner": {"pid": pid}}));
            assert_eq!(reply["ok"], true, "{reply}");
            session
        })
        .collect()
}

fn wait_until_dead(group: &OrphanGroup) {
    let dead = eventually(ARRIVAL, || {
        group
            .members
            .iter()
            .all(|&(pid, _)| integration_tests::state(pid).is_none_or(|s| s == 'Z'))
    });
    assert!(dead, "the owners did not die");
}

/// The whole event log, replayed from the first event until it stays quiet.
fn replay_all(daemon: &Daemon) -> Vec<Value> {
    let mut stream = daemon.connect();
    assert_eq!(
        stream.request(json!({"op": "subscribe", "since": 0}))["ok"],
        true
    );
    std::iter::from_fn(|| stream.next_within(QUIET))
        .map(|line| line["event"].clone())
        .collect()
}

/// The daemon is SIGKILLed in the middle of finalizing a burst of deaths, round after
/// round: after each restart the reconcile ends what was not committed, and in the end
/// every session was registered once and ended once, under contiguous seqs.
#[test]
fn sigkill_in_the_middle_of_a_burst_loses_and_repeats_nothing() {
    let rounds = fault_rounds(3);
    let mut daemon = Daemon::start(&[]);
    let mut sessions = Vec::new();
    let mut by_reconcile = 0;
    for round in 0..rounds {
        let mut group = OrphanGroup::spawn(BURST, &["exit", "0"]);
        sessions.extend(register_group(&daemon, &group, &format!("round{round}-")));
        let mut stream = daemon.connect();
        assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
        group.release();
        // The first ending is committed: the daemon is busy with the burst.
        let first = stream.next_within(ARRIVAL).expect("the first ending");
        assert_eq!(first["event"]["kind"], "session.ended", "{first}");
        daemon.kill9();
        wait_until_dead(&group);
        daemon.restart();
    }

    let events = replay_all(&daemon);
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    let contiguous: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(
        seqs, contiguous,
        "seqs are contiguous across {rounds} SIGKILLs"
    );
    let mut registered = std::collections::BTreeMap::<&str, usize>::new();
    let mut ended = std::collections::BTreeMap::<&str, usize>::new();
    for event in &events {
        let session = event["session"]
            .as_str()
            .expect("an event names its session");
        match event["kind"].as_str() {
            Some("session.registered") => *registered.entry(session).or_default() += 1,
            Some("session.ended") => {
                *ended.entry(session).or_default() += 1;
                by_reconcile += usize::from(event["detected_by"] == "reconcile");
            }
            other => panic!("unexpected event {other:?}: {event}"),
        }
    }
    for session in &sessions {
        assert_eq!(
            registered.get(session.as_str()),
            Some(&1),
            "{session} registered"
        );
        assert_eq!(
            ended.get(session.as_str()),
            Some(&1),
            "{session} ended once"
        );
    }
    assert_eq!(events.len(), 2 * sessions.len(), "no other event");
    eprintln!(
        "{rounds} SIGKILLs mid-burst: {} sessions each ended once, {by_reconcile} by the reconcile after a restart",
        sessions.len()
    );
}

/// A one-page ring buffer and a daemon that cannot read it (SIGSTOP) while hundreds of
/// tracked owners die: the kernel drops most records. The daemon notices the loss once it
/// runs again, re-checks every owner, and each session still ends exactly once.
#[test]
fn deaths_dropped_by_a_full_ring_buffer_end_once_by_reconcile() {
    if !privileged("deaths_dropped_by_a_full_ring_buffer_end_once_by_reconcile") {
        return;
    }
    const OWNERS: usize = 300;
    let rounds = fault_rounds(1);
    let daemon = Daemon::start(&["--sources", "ebpf", "--ebpf-ring-bytes", "4096"]);
    let mut control = daemon.connect();
    for round in 0..rounds {
        let mut group = OrphanGroup::spawn(OWNERS, &["exit", "0"]);
        let sessions = register_group(&daemon, &group, &format!("ring{round}-"));
        let mut stream = daemon.connect();
        assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
        daemon.signal(libc::SIGSTOP);
        group.release();
        wait_until_dead(&group);
        daemon.signal(libc::SIGCONT);

        let mut ended = std::collections::BTreeMap::<String, usize>::new();
        while ended.len() < OWNERS {
            let line = stream.next_within(ARRIVAL).unwrap_or_else(|| {
                panic!(
                    "round {round}: {} of {OWNERS} endings arrived; status {}",
                    ended.len(),
                    status(&mut control)
                )
            });
            assert_eq!(line["event"]["kind"], "session.ended", "{line}");
            let session = line["event"]["session"].as_str().unwrap().to_owned();
            *ended.entry(session).or_default() += 1;
        }
        assert!(stream.next_within(QUIET).is_none(), "a session ended twice");
        assert!(
            ended
                .keys()
                .eq(sessions.iter().collect::<std::collections::BTreeSet<_>>())
                && ended.values().all(|&n| n == 1),
            "round {round}: {ended:?}"
        );
    }
    let status = status(&mut control);
    let ebpf = status["monitor"]["sources"]
        .as_array()
        .and_then(|sources| sources.iter().find(|s| s["name"] == "ebpf"))
        .unwrap_or_else(|| panic!("no ebpf source: {status}"));
    let lost = ebpf["stats"]["lost"].as_u64().unwrap_or_default();
    assert!(lost > 0, "the ring never overflowed: {status}");
    assert!(
        status["monitor"]["loss_reconciles"].as_u64() >= Some(rounds as u64),
        "{status}"
    );
    eprintln!(
        "{rounds} round(s) of {OWNERS} deaths into a 4 KiB ring: {lost} records lost, each session ended once"
    );
}

/// Field names and values a request might hold, for building plausible garbage.
const FIELDS: &[&str] = &[
    "op",
    "v",
    "id",
    "session",
    "uid",
    "owner",
    "pid",
    "pending",
    "labels",
    "to",
    "phase",
    "since",
    "store_id",
    "start_ticks",
    "boot_id",
    "host",
];
const OPS: &[&str] = &[
    "register",
    "rename",
    "touch",
    "end",
    "get",
    "list",
    "whose",
    "status",
    "subscribe",
];

/// Lines that are not valid requests, or are only by chance: JSON objects built from the
/// protocol's words with values of any type, any bytes, and lines over the length limit.
fn garbage_lines() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(OPS).prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(prop::sample::select(FIELDS), inner, 0..4).prop_map(
                |map| Value::Object(map.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            ),
        ]
    });
    let request = (
        prop::sample::select(OPS),
        prop::collection::btree_map(prop::sample::select(FIELDS), value, 0..5),
    )
        .prop_map(|(op, fields)| {
            let mut object: serde_json::Map<String, Value> =
                fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            object.entry("op").or_insert_with(|| op.into());
            Value::Object(object).to_string().into_bytes()
        });
    prop_oneof![
        8 => request,
        4 => prop::collection::vec(any::<u8>(), 0..256),
        1 => (any::<u8>(), 64 * 1024..70 * 1024usize).prop_map(|(byte, length)| vec![byte; length]),
    ]
    // One line each: a newline inside would make several.
    .prop_map(|line| {
        line.into_iter()
            .map(|b| if b == b'\n' { b' ' } else { b })
            .collect()
    })
}

/// Garbage on a real connection: every line that is not a request gets one reply, valid
/// JSON with `ok: false` and an error code, the connection stays usable, and nothing in
/// the daemon changed. `PROPTEST_CASES` sets the number of lines.
#[test]
fn garbage_lines_get_json_errors_and_change_nothing() {
    let daemon = Daemon::start(&[]);
    let conn = std::cell::RefCell::new(daemon.connect());
    let refused = std::cell::Cell::new(0usize);
    // Cases from PROPTEST_CASES; a failing line is printed, not saved to a file.
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&garbage_lines(), |line| {
        if liveness::protocol::parse_request(&line).is_ok()
            || line.iter().all(u8::is_ascii_whitespace)
        {
            // A valid request (by chance) would change state; a blank line has no reply.
            return Ok(());
        }
        let mut conn = conn.borrow_mut();
        conn.send_raw(&[line.as_slice(), b"\n"].concat());
        let reply = conn.next_line().expect("a reply, not a closed connection");
        prop_assert_eq!(&reply["ok"], &json!(false), "{}", reply);
        prop_assert!(reply["error"]["code"].is_string(), "{}", reply);
        refused.set(refused.get() + 1);
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    let status = status(&mut conn.borrow_mut());
    assert_eq!(status["head_seq"], 0, "garbage changed something: {status}");
    let list = daemon.request(json!({"op": "list"}));
    assert_eq!(list["sessions"], json!([]), "{list}");
    eprintln!(
        "{} garbage lines refused, each with a JSON error",
        refused.get()
    );
}
