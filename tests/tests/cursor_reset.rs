//! Consumers whose cursor belongs to a database that is gone: the daemon's database was
//! deleted, or replaced by another, while a consumer was away. Seqs start over in the new
//! database, so resuming "after seq N" would skip its first N events: the daemon says
//! `reset` instead, and the consumer starts over with the new database's first event.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use integration_tests::{Conn, Daemon, Orphan, binary, eventually};
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(20);
/// Endings after the reset, as in the report of the events that were lost.
const ENDINGS_AFTER_RESET: usize = 17;

/// Registers and ends sessions `{prefix}0..{prefix}N`: two events each.
fn end_sessions(daemon: &Daemon, prefix: &str, count: usize) {
    let mut conn = daemon.connect();
    let owner = std::process::id();
    for i in 0..count {
        let session = format!("{prefix}{i}");
        let reply =
            conn.request(json!({"op": "register", "session": session, "owner": {"pid": owner}}));
        assert_eq!(reply["ok"], true, "{reply}");
        let reply = conn.request(json!({"op": "end", "session": session}));
        assert_eq!(reply["ok"], true, "{reply}");
    }
}

/// Sessions `{prefix}0..{prefix}N`, each ended by its owner's death before the next is
/// registered: two events each, in order.
fn owners_die(daemon: &Daemon, prefix: &str, count: usize) {
    let mut conn = daemon.connect();
    for i in 0..count {
        let session = format!("{prefix}{i}");
        let mut owner = Orphan::spawn(&["exit", "0"]);
        let reply = conn
            .request(json!({"op": "register", "session": session, "owner": {"pid": owner.pid}}));
        assert_eq!(reply["ok"], true, "{reply}");
        owner.release();
        let ended = eventually(ARRIVAL, || {
            let reply = conn.request(json!({"op": "get", "session": session}));
            reply["session"]["phase"] == "ended"
        });
        assert!(ended, "the owner's death ended {session}");
    }
}

fn store_id(daemon: &Daemon) -> String {
    let reply = daemon.request(json!({"op": "status"}));
    reply["status"]["store_id"]
        .as_str()
        .unwrap_or_else(|| panic!("status has no store_id: {reply}"))
        .to_owned()
}

/// `liveness watch --exec --cursor`, appending "SEQ SESSION" for each ending to a file.
struct Watcher {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Watcher {
    fn new() -> Watcher {
        Watcher {
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        }
    }

    fn cursor(&self) -> PathBuf {
        self.dir.path().join("cursor")
    }

    fn start(&mut self, daemon: &Daemon) {
        assert!(self.child.is_none(), "the watcher is running");
        let command = format!(
            "echo \"$LIVENESS_SEQ $LIVENESS_SESSION\" >> {}",
            self.dir.path().join("handled").display()
        );
        let child = Command::new(binary("liveness"))
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["watch", "--since", "0", "--exec", &command, "--cursor"])
            .arg(self.cursor())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("stderr")).unwrap())
            .spawn()
            .expect("start liveness watch");
        self.child = Some(child);
    }

    fn stop(&mut self) {
        let mut child = self.child.take().expect("the watcher is running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Sessions whose ending ran the hook, in order.
    fn handled(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("handled"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(_, session)| session.to_owned()))
            .collect()
    }

    fn saved_cursor(&self) -> String {
        std::fs::read_to_string(self.cursor())
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Waits until the hook ran for exactly `expected`, each once, and the cursor was saved
    /// after the last.
    fn expect_handled(&self, expected: &[String], cursor: &str) {
        let done = eventually(ARRIVAL, || {
            self.handled().len() >= expected.len() && self.saved_cursor() == cursor
        });
        assert!(
            done && self.handled() == expected,
            "hooks run for {:?},\nexpected {expected:?};\ncursor {:?}, expected {cursor:?};\nwatcher said: {}",
            self.handled(),
            self.saved_cursor(),
            self.stderr()
        );
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

/// Removes the database and its WAL files.
fn remove_database(state_dir: &Path) {
    for name in ["liveness.db", "liveness.db-wal", "liveness.db-shm"] {
        match std::fs::remove_file(state_dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {name}: {e}"),
        }
    }
}

#[test]
fn a_watcher_whose_database_was_deleted_runs_every_hook_after_the_reset() {
    let mut daemon = Daemon::start(&[]);
    let old_store = store_id(&daemon);
    let mut watcher = Watcher::new();
    watcher.start(&daemon);
    end_sessions(&daemon, "old-", 20);
    watcher.expect_handled(&names("old-", 20), &format!("40 {old_store}"));
    watcher.stop();
    // A cursor as earlier versions saved it, without the store id: the seq alone, above
    // the new head, tells the daemon it is void.
    std::fs::write(watcher.cursor(), "40\n").unwrap();

    assert!(daemon.stop().success());
    remove_database(&daemon.state_dir);
    daemon.restart();
    let new_store = store_id(&daemon);
    assert_ne!(new_store, old_store, "a new database is a new store");

    watcher.start(&daemon);
    end_sessions(&daemon, "new-", ENDINGS_AFTER_RESET);
    let mut expected = names("old-", 20);
    expected.extend(names("new-", ENDINGS_AFTER_RESET));
    watcher.expect_handled(
        &expected,
        &format!("{} {new_store}", 2 * ENDINGS_AFTER_RESET),
    );
    assert!(
        watcher.stderr().contains("starting over"),
        "the watcher did not say why it started over: {}",
        watcher.stderr()
    );
}

#[test]
fn a_watcher_resuming_in_a_replaced_database_runs_every_hook() {
    let mut daemon = Daemon::start(&[]);
    let old_store = store_id(&daemon);
    let mut watcher = Watcher::new();
    watcher.start(&daemon);
    end_sessions(&daemon, "old-", 2);
    watcher.expect_handled(&names("old-", 2), &format!("4 {old_store}"));
    watcher.stop();

    // The database is replaced by a fresh one (restored from elsewhere, recreated).
    assert!(daemon.stop().success());
    let fresh = daemon.dir.path().join("fresh.db");
    drop(liveness_daemon::Store::open(&fresh).expect("create a fresh database"));
    remove_database(&daemon.state_dir);
    std::fs::rename(&fresh, daemon.state_dir.join("liveness.db")).unwrap();
    daemon.restart();
    let new_store = store_id(&daemon);
    assert_ne!(new_store, old_store);

    // The new head passes the cursor before the watcher is back: only the store id shows
    // that seqs 1..=4 here are not the events the watcher handled.
    end_sessions(&daemon, "new-", ENDINGS_AFTER_RESET);
    watcher.start(&daemon);
    let mut expected = names("old-", 2);
    expected.extend(names("new-", ENDINGS_AFTER_RESET));
    watcher.expect_handled(
        &expected,
        &format!("{} {new_store}", 2 * ENDINGS_AFTER_RESET),
    );
}

/// Copies the state directory's files (the database, its WAL, the journal) to `to`.
fn copy_state(from: &Path, to: &Path) {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(to)
        .unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// The state is restored from a copy made at seq 10, after the daemon had gone on to 30: the
/// seqs from 11 are given out again, for other events. A watcher that had handled up to 22
/// in the lost run is told to start over, and runs its command for every ending of the
/// restored state, the six new ones at seqs 11..=22 too.
#[test]
fn a_watcher_resuming_in_a_state_restored_from_an_older_copy_runs_every_hook() {
    let mut daemon = Daemon::start(&[]);
    let mut watcher = Watcher::new();
    watcher.start(&daemon);
    owners_die(&daemon, "a", 5);
    let first = store_id(&daemon);
    watcher.expect_handled(&names("a", 5), &format!("10 {first}"));
    assert!(daemon.stop().success());
    let copy = daemon.dir.path().join("copy");
    copy_state(&daemon.state_dir, &copy);

    daemon.restart();
    let lost = store_id(&daemon);
    owners_die(&daemon, "b", 6);
    let mut handled = names("a", 5);
    handled.extend(names("b", 6));
    watcher.expect_handled(&handled, &format!("22 {lost}"));
    watcher.stop();
    owners_die(&daemon, "lost", 4);
    assert!(daemon.stop().success());

    // Restored: the copy's files replace the state's.
    std::fs::remove_dir_all(&daemon.state_dir).unwrap();
    copy_state(&copy, &daemon.state_dir);
    daemon.restart();
    owners_die(&daemon, "c", 15);
    let restored = store_id(&daemon);
    assert_eq!(
        daemon.request(json!({"op": "status"}))["status"]["head_seq"],
        40
    );
    watcher.start(&daemon);
    handled.extend(names("a", 5));
    handled.extend(names("c", 15));
    watcher.expect_handled(&handled, &format!("40 {restored}"));
    assert!(
        watcher.stderr().contains("starting over"),
        "the watcher did not say why it started over: {}",
        watcher.stderr()
    );

    // A restart without a restore keeps the cursor: nothing is handled again.
    watcher.stop();
    assert!(daemon.stop().success());
    daemon.restart();
    owners_die(&daemon, "d", 1);
    watcher.start(&daemon);
    handled.extend(names("d", 1));
    watcher.expect_handled(&handled, &format!("42 {}", store_id(&daemon)));
}

fn subscribe(daemon: &Daemon, request: Value) -> (Conn, Value) {
    let mut conn = daemon.connect();
    let ack = conn.request(request);
    assert_eq!(ack["ok"], true, "{ack}");
    (conn, ack["subscribed"].clone())
}

fn next(conn: &mut Conn) -> Value {
    conn.next_within(ARRIVAL).expect("a stream line")
}

#[test]
fn a_void_cursor_is_told_reset_and_replayed_from_the_first_event() {
    let daemon = Daemon::start(&[]);
    end_sessions(&daemon, "s", 2);
    let store = store_id(&daemon);

    // Above the head.
    let (mut stream, ack) = subscribe(&daemon, json!({"op": "subscribe", "since": 9}));
    assert_eq!(ack, json!({"since": 0, "head": 4, "store_id": store}));
    assert_eq!(
        next(&mut stream),
        json!({"reset": {"since": 9, "head": 4, "store_id": store}})
    );
    let seqs: Vec<Value> = (0..4)
        .map(|_| next(&mut stream)["event"]["seq"].clone())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4], "every event follows the reset");
    end_sessions(&daemon, "live", 1);
    assert_eq!(next(&mut stream)["event"]["seq"], 5, "and then live ones");

    // Below the head, but from another store.
    let (mut stream, ack) = subscribe(
        &daemon,
        json!({"op": "subscribe", "since": 3, "store_id": "0123456789abcdef"}),
    );
    assert_eq!(ack["since"], 0, "{ack}");
    assert_eq!(next(&mut stream)["reset"]["since"], 3);
    assert_eq!(next(&mut stream)["event"]["seq"], 1);

    // This store's cursor resumes as always, with no reset.
    let (mut stream, ack) = subscribe(
        &daemon,
        json!({"op": "subscribe", "since": 3, "store_id": store}),
    );
    assert_eq!(ack, json!({"since": 3, "head": 6, "store_id": store}));
    assert_eq!(next(&mut stream)["event"]["seq"], 4);
}
