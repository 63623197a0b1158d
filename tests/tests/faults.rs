//! Fault injection: a full disk, SIGKILL in the middle of a burst of deaths, a ring buffer
//! that overflows, garbage on the socket, floods by another user (connections, half lines,
//! listings), and damaged, deleted or foreign state. `cargo xtask chaos` runs these with more
//! rounds and inputs (`LIVENESS_FAULT_ROUNDS`, `PROPTEST_CASES`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::{
    ClientAs, Conn, Daemon, Orphan, OrphanGroup, SmallFs, eventually, fault_rounds,
    open_socket_to_everyone, privileged, refused_start,
};
use liveness_proc::identity::Stat;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(1500);

fn status(conn: &mut Conn) -> Value {
    let reply = conn.request(json!({"op": "status"}));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["status"].clone()
}

/// An owner dies while the database cannot grow. Its ending is journaled in the space the
/// journal reserved at start, so it is published at once, exactly once; until the database
/// has it, reads answer from what is committed and what waits in memory (never the session
/// as still active), and `status` says the disk is full and what waits; once space is back,
/// the database has it without a restart.
#[test]
fn a_death_on_a_full_disk_is_published_and_written_once_space_returns() {
    if !privileged("a_death_on_a_full_disk_is_published_and_written_once_space_returns") {
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
    let bystander = Orphan::spawn(&["exit", "0"]);
    let reply = control.request(
        json!({"op": "register", "session": "bystander", "owner": {"pid": bystander.pid}}),
    );
    assert_eq!(reply["ok"], true, "{reply}");

    let filler = fs.fill();
    owner.release();
    let ended = loop {
        let line = stream
            .next_within(ARRIVAL)
            .expect("the death is published from the journal's reserved space");
        if line["event"]["session"] == "full" {
            break line;
        }
    };
    assert_eq!(ended["event"]["kind"], "session.ended", "{ended}");
    assert_eq!(ended["event"]["reason"], "owner_exited", "{ended}");
    assert_eq!(ended["event"]["exit"], json!({"kind": "exited", "code": 3}));
    assert_ne!(ended["event"]["detected_by"], "reconcile", "{ended}");

    // Reads are answered while the disk is full: the ending, which only the journal has,
    // shows; the database's rows show the rest.
    let got = control.request(json!({"op": "get", "session": "full"}));
    assert_eq!(got["ok"], true, "a read is answered: {got}");
    assert_eq!(got["session"]["phase"], "ended", "{got}");
    assert_eq!(got["session"]["exit"], ended["event"]["exit"], "{got}");
    assert_eq!(got["session"]["reason"], "owner_exited", "{got}");
    let got = control.request(json!({"op": "get", "session": "bystander"}));
    assert_eq!(got["session"]["phase"], "active", "{got}");
    let listed = control.request(json!({"op": "list"}));
    assert_eq!(listed["ok"], true, "{listed}");
    let phases: Vec<(Value, Value)> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].clone(), s["phase"].clone()))
        .collect();
    assert_eq!(
        phases,
        [
            (json!("full"), json!("ended")),
            (json!("bystander"), json!("active"))
        ],
        "{listed}"
    );
    let active = control.request(json!({"op": "list", "phase": "active"}));
    let ids: Vec<&Value> = active["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["id"])
        .collect();
    assert_eq!(ids, [&json!("bystander")], "{active}");
    let full = status(&mut control);
    assert_eq!(
        full["store"],
        json!({"disk_full": true, "waiting": 1}),
        "status says why: {full}"
    );
    assert_eq!(full["active_sessions"], 1, "{full}");
    assert_eq!(full["ended_sessions"], 1, "{full}");
    assert_eq!(full["head_seq"], ended["event"]["seq"], "{full}");
    let text = std::process::Command::new(integration_tests::binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .arg("status")
        .output()
        .expect("liveness status");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("the disk is full: 1 published endings wait for it"),
        "{text}"
    );
    assert!(
        daemon.log().contains("no space left on device"),
        "a full disk is named as such:\n{}",
        daemon.log()
    );

    std::fs::remove_file(filler).expect("free the space");
    assert!(
        eventually(ARRIVAL, || {
            let session = control.request(json!({"op": "get", "session": "full"}));
            session["session"]["phase"] == "ended"
        }),
        "the database has the ending once space returns"
    );
    assert!(
        stream.next_within(QUIET).is_none(),
        "the session ended more than once"
    );
    let after = status(&mut control);
    assert_eq!(after["uncommitted_deaths"], 0, "{after}");
    assert_eq!(
        after["store"],
        json!({"disk_full": false, "waiting": 0}),
        "{after}"
    );
    assert!(
        after["counters"]["failed_commits"].as_u64() >= Some(1),
        "{after}"
    );
    assert_eq!(after["head_seq"], ended["event"]["seq"], "{after}");
}

/// A journal that cannot reserve its space at start (less than its 1 MiB is free) writes
/// each append instead: a death is journaled, published, and after a SIGKILL before its
/// SQLite write, replayed once.
#[test]
fn a_journal_without_room_to_reserve_writes_its_appends_and_replays_them() {
    if !privileged("a_journal_without_room_to_reserve_writes_its_appends_and_replays_them") {
        return;
    }
    let fs = SmallFs::mount("768k");
    let mut daemon =
        Daemon::start_with_state(Some(fs.path().join("state")), &["--sources", "ebpf"]);
    assert!(
        daemon
            .log()
            .contains("the journal cannot reserve its space"),
        "the fallback is logged:\n{}",
        daemon.log()
    );
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    let mut owner = Orphan::spawn(&["exit", "5"]);
    let reply =
        daemon.request(json!({"op": "register", "session": "small", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    owner.release();
    let ended = stream.next_event_of("session.ended", "small", ARRIVAL);
    assert_eq!(
        ended["exit"],
        json!({"kind": "exited", "code": 5}),
        "{ended}"
    );
    // Before the SQLite write, a second after the publish: only the journal has it.
    daemon.kill9();

    daemon.restart();
    let session = daemon.session("small");
    assert_eq!(session["phase"], "ended", "{session}");
    assert_eq!(session["exit"], ended["exit"], "{session}");
    let mut replayed = daemon.connect();
    assert_eq!(
        replayed.request(json!({"op": "subscribe", "since": 0}))["ok"],
        true
    );
    let mut endings = 0;
    while let Some(line) = replayed.next_within(QUIET) {
        endings += usize::from(line["event"]["kind"] == "session.ended");
    }
    assert_eq!(endings, 1, "the death is replayed once");
}

/// A uid that floods the daemon in the tests below.
const FLOODER: u32 = 61_010;

/// How many log lines say that a limit refused something.
fn limit_lines(daemon: &Daemon) -> usize {
    daemon
        .log()
        .lines()
        .filter(|l| l.contains("limit reached"))
        .count()
}

/// One user opens connections until refused: root still connects, registers and sees its
/// session end; the limit is logged once, not per refusal; status counts it all, and a uid
/// that closed its connections leaves nothing behind.
#[test]
fn a_connection_flood_by_one_user_leaves_root_served() {
    if !privileged("a_connection_flood_by_one_user_leaves_root_served") {
        return;
    }
    const LIMIT: usize = 16;
    const TRIED: usize = 40;
    let daemon = Daemon::start(&["--max-connections-per-uid", &LIMIT.to_string()]);
    open_socket_to_everyone(&daemon);
    let mut flood: Vec<ClientAs> = Vec::new();
    let (mut admitted, mut refused) = (0, 0);
    for _ in 0..TRIED {
        let mut client = ClientAs::connect(&daemon, FLOODER);
        match client.request(&json!({"op": "status"})) {
            Some(reply) if reply["ok"] == true => admitted += 1,
            Some(reply) => {
                assert_eq!(reply["error"]["code"], "too_many_connections", "{reply}");
                refused += 1;
            }
            None => panic!("a connection closed without a word"),
        }
        flood.push(client);
    }
    assert_eq!((admitted, refused), (LIMIT, TRIED - LIMIT));

    let mut control = daemon.connect();
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    let mut owner = Orphan::spawn(&["exit", "0"]);
    let reply =
        control.request(json!({"op": "register", "session": "root", "owner": {"pid": owner.pid}}));
    assert_eq!(
        reply["ok"], true,
        "root is served during the flood: {reply}"
    );
    owner.release();
    let ended = eventually(ARRIVAL, || {
        stream
            .next_within(ARRIVAL)
            .is_some_and(|line| line["event"]["kind"] == "session.ended")
    });
    assert!(ended, "root's session did not end during the flood");

    let limits = status(&mut control)["limits"]["connections"].clone();
    assert_eq!(
        limits["refused"]["connections_per_uid"],
        TRIED - LIMIT,
        "{limits}"
    );
    assert_eq!(limits["connections"]["non_root"], LIMIT, "{limits}");
    assert_eq!(
        limit_lines(&daemon),
        1,
        "one line, not one per refusal:\n{}",
        daemon.log()
    );
    drop(flood);
    assert!(
        eventually(ARRIVAL, || {
            let now = status(&mut control)["limits"]["connections"].clone();
            now["connections"]["non_root"] == 0 && now["connections"]["uids"] == 0
        }),
        "the flood's connections are still counted: {}",
        status(&mut control)
    );
}

/// A client that sends half a request line and stalls is disconnected, and counted.
#[test]
fn a_stalled_half_line_is_disconnected() {
    let daemon = Daemon::start(&["--line-timeout", "200ms"]);
    let mut stalled = daemon.connect();
    stalled.send_raw(&vec![b'x'; 60 * 1024]);
    assert_eq!(stalled.next_line(), None, "the connection was not closed");
    let limits = daemon.request(json!({"op": "status"}))["status"]["limits"].clone();
    assert_eq!(
        limits["connections"]["refused"]["line_timeout"], 1,
        "{limits}"
    );
}

/// Three connections of a user looping `list` over 20,000 sessions: root's ending of a
/// SIGKILLed owner still arrives within a generous bound, and the listings still answer.
#[test]
fn list_loops_of_a_user_do_not_hold_roots_endings() {
    if !privileged("list_loops_of_a_user_do_not_hold_roots_endings") {
        return;
    }
    const SESSIONS: usize = 20_000;
    const BOUND: Duration = Duration::from_secs(2);
    let daemon = Daemon::start(&["--max-sessions-per-uid", "30000"]);
    open_socket_to_everyone(&daemon);
    let mut registrar = ClientAs::connect(&daemon, FLOODER);
    let elsewhere = json!({"pid": 1, "start_ticks": 1, "boot_id": "b", "host": "elsewhere"});
    let mut writer = registrar.0.to.take().expect("stdin");
    let requests = std::thread::spawn(move || {
        for i in 0..SESSIONS {
            let request = json!({"op": "register", "session": format!("u{i}"), "owner": elsewhere});
            writeln!(writer, "{request}").expect("pipeline a registration");
        }
    });
    for i in 0..SESSIONS {
        let reply = registrar.next_line().expect("a reply per registration");
        assert_eq!(reply["ok"], true, "registration {i}: {reply}");
    }
    requests.join().unwrap();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listers: Vec<_> = (0..3)
        .map(|_| {
            let mut client = ClientAs::connect(&daemon, FLOODER);
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut passes = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (mut seen, mut after) = (0, Value::Null);
                    loop {
                        let reply = client
                            .request(&json!({"op": "list", "after": after}))
                            .expect("a list reply");
                        assert_eq!(reply["ok"], true, "{reply}");
                        seen += reply["sessions"].as_array().expect("sessions").len();
                        after = reply["next"].clone();
                        if after.is_null() {
                            break;
                        }
                    }
                    assert_eq!(seen, SESSIONS, "a full pass lists every session once");
                    passes += 1;
                }
                passes
            })
        })
        .collect();

    let mut control = daemon.connect();
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    for round in 0..5 {
        let owner = Orphan::spawn(&["exit", "0"]);
        let session = format!("root-{round}");
        let reply = control
            .request(json!({"op": "register", "session": session, "owner": {"pid": owner.pid}}));
        assert_eq!(reply["ok"], true, "{reply}");
        assert_eq!(
            stream.next_line().expect("registered")["event"]["kind"],
            "session.registered"
        );
        // SAFETY: killing the orphan this test started.
        unsafe { libc::kill(owner.pid as i32, libc::SIGKILL) };
        let ended = stream.next_within(BOUND).unwrap_or_else(|| {
            panic!("round {round}: no ending within {BOUND:?} while users list")
        });
        assert_eq!(ended["event"]["kind"], "session.ended", "{ended}");
        assert_eq!(ended["event"]["session"], session, "{ended}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for lister in listers {
        let passes = lister.join().expect("a lister failed");
        assert!(passes >= 1, "a lister never completed a pass");
    }
}

fn database(daemon: &Daemon) -> PathBuf {
    daemon.state_dir.join("liveness.db")
}

/// A database truncated to 0 bytes is refused (not started afresh); `--recover` keeps it
/// aside, starts a new one whose seqs skip ahead, and runs.
#[test]
fn a_truncated_database_is_refused_until_recovered() {
    let mut daemon = Daemon::start(&[]);
    let owner = Orphan::spawn(&["exit", "0"]);
    let reply =
        daemon.request(json!({"op": "register", "session": "s", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert!(daemon.stop().success());
    std::fs::File::create(database(&daemon)).expect("truncate the database");

    let stderr = refused_start(&daemon.state_dir, &[]);
    assert!(
        stderr.contains("damaged") && stderr.contains("--recover"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::metadata(database(&daemon)).unwrap().len(),
        0,
        "left as it was"
    );

    let recovered = Daemon::start_with_state(Some(daemon.state_dir.clone()), &["--recover"]);
    let status = recovered.request(json!({"op": "status"}));
    assert_eq!(status["ok"], true, "{status}");
    assert!(
        status["status"]["head_seq"].as_u64() >= Some(1 << 20),
        "seqs skip ahead: {status}"
    );
    assert!(
        recovered.log().contains("recovered the damaged database"),
        "{}",
        recovered.log()
    );
    let kept = std::fs::read_dir(&daemon.state_dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("liveness.db.damaged-")
        });
    assert!(kept, "the damaged file was not kept");
}

/// A database with a page of garbage is refused with the way out.
#[test]
fn a_database_with_overwritten_pages_is_refused() {
    use std::io::{Seek, SeekFrom};
    let mut daemon = Daemon::start(&[]);
    for i in 0..50 {
        let owner = json!({"pid": 1, "start_ticks": 1, "boot_id": "b", "host": "elsewhere"});
        let labels = json!({"pad": "x".repeat(1000)});
        let reply = daemon.request(
            json!({"op": "register", "session": format!("s{i}"), "owner": owner, "labels": labels}),
        );
        assert_eq!(reply["ok"], true, "{reply}");
    }
    assert!(daemon.stop().success());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(database(&daemon))
        .unwrap();
    // Every page after the first (which holds the header and schema).
    let length = file.metadata().unwrap().len();
    file.seek(SeekFrom::Start(4096)).unwrap();
    file.write_all(&vec![0xa5; length as usize - 4096]).unwrap();
    drop(file);
    let stderr = refused_start(&daemon.state_dir, &[]);
    assert!(
        stderr.contains("damaged") && stderr.contains("--recover"),
        "{stderr}"
    );
}

/// A database deleted while the daemon runs stops it, non-zero, saying why, instead of
/// letting it write into a file nobody will open again.
#[test]
fn a_database_deleted_while_running_stops_the_daemon() {
    let mut daemon = Daemon::start(&[]);
    std::fs::remove_file(database(&daemon)).expect("delete the database");
    assert!(
        eventually(ARRIVAL, || daemon.exited().is_some()),
        "the daemon kept running"
    );
    let log = daemon.log();
    assert!(log.contains("was deleted while the daemon ran"), "{log}");
    assert_eq!(daemon.exited().and_then(|s| s.code()), Some(1), "{log}");
}

/// State directories that others could read or that belong to someone else are refused,
/// saying how to fix them.
#[test]
fn state_directories_open_to_others_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stderr = refused_start(&state, &[]);
    assert!(stderr.contains("chmod 0700"), "{stderr}");
    if privileged("state_directories_open_to_others_are_refused (foreign owner)") {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&state, Some(FLOODER), Some(FLOODER)).unwrap();
        let stderr = refused_start(&state, &[]);
        assert!(
            stderr.contains(&format!("belongs to uid {FLOODER}")),
            "{stderr}"
        );
    }
}

/// Under umask 0 the database, its journal and the lock are 0600 and the state directory
/// 0700; the socket stays connectable by everyone.
#[test]
fn files_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = Daemon::start_under(&["sh", "-c", "umask 0; exec \"$0\" \"$@\""], None, &[]);
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&daemon.state_dir), 0o700);
    for entry in std::fs::read_dir(&daemon.state_dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    assert_eq!(mode(&daemon.socket), 0o666);
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A flood of connections each holding a 60 KB half line costs memory while it lasts;
/// once they close, the memory is given back (not kept at the flood's high-water mark).
#[test]
fn memory_of_a_half_line_flood_is_given_back() {
    use std::os::unix::net::UnixStream;
    const CONNECTIONS: usize = 1000;
    const HELD: u64 = 40 * 1024;
    const LEFT: u64 = 16 * 1024;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let wanted = CONNECTIONS as u64 + 256;
    if limit.maximum.is_some_and(|hard| hard < wanted) {
        eprintln!("skipping: the open-file limit is below {wanted}");
        return;
    }
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(wanted.max(limit.current.unwrap_or(0))),
            maximum: limit.maximum,
        },
    )
    .expect("raise the open-file limit");
    // Root is not limited, so every connection is admitted and holds its half line.
    let daemon = Daemon::start(&["--line-timeout", "10m"]);
    assert_eq!(daemon.request(json!({"op": "status"}))["ok"], true);
    let before = rss_kib(daemon.pid());
    let half_line = vec![b'x'; 60 * 1024];
    let flood: Vec<UnixStream> = (0..CONNECTIONS)
        .map(|_| {
            let mut stream = UnixStream::connect(&daemon.socket).expect("connect");
            stream.write_all(&half_line).expect("send half a line");
            stream
        })
        .collect();
    assert!(
        eventually(ARRIVAL, || rss_kib(daemon.pid()) > before + HELD),
        "the flood was not buffered: {} KiB before, {} KiB now",
        before,
        rss_kib(daemon.pid())
    );
    drop(flood);
    // Each reading that differs from the last, so that a failure tells memory kept from
    // connections slow to close.
    let mut after: Vec<u64> = Vec::new();
    let given_back = eventually(Duration::from_secs(30), || {
        let now = rss_kib(daemon.pid());
        if after.last() != Some(&now) {
            after.push(now);
        }
        now < before + LEFT
    });
    assert!(
        given_back,
        "memory was kept after the flood: {before} KiB before, then {after:?} KiB over 30 s"
    );
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

/// Waits until every thread of the daemon has stopped: a SIGSTOP takes effect once one
/// thread handles it, and a thread that runs meanwhile may still read the ring.
fn wait_until_stopped(daemon: &Daemon) {
    let tasks = format!("/proc/{}/task", daemon.pid());
    let stopped = eventually(ARRIVAL, || {
        std::fs::read_dir(&tasks).unwrap().flatten().all(|task| {
            std::fs::read(task.path().join("stat"))
                .is_ok_and(|stat| Stat::parse(&stat).is_ok_and(|stat| stat.state == 'T'))
        })
    });
    assert!(stopped, "the daemon did not stop");
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
        wait_until_stopped(&daemon);
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
        if liveness_common::protocol::parse_request(&line).is_ok()
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

/// With its descriptors used up by one user's connections (the connection limits raised
/// out of the way), the daemon still accepts, sees who connects, refuses that user and
/// serves root, through the descriptor it keeps spare.
#[test]
fn out_of_descriptors_the_daemon_still_serves_root() {
    if !privileged("out_of_descriptors_the_daemon_still_serves_root") {
        return;
    }
    out_of_descriptors_root_is_served(None);
}

/// The same, with each refused connection closed 50 ms after its refusal, and the next
/// one coming after that: the descriptor the close frees came back after the listener had
/// looked for its reserve, and went to that next connection, so that nobody (root neither)
/// was accepted again and that user's next request waited forever.
#[test]
fn out_of_descriptors_with_slow_closes_the_daemon_still_serves_root() {
    if !privileged("out_of_descriptors_with_slow_closes_the_daemon_still_serves_root") {
        return;
    }
    out_of_descriptors_root_is_served(Some(("slow-close", Duration::from_millis(100))));
}

/// See [`out_of_descriptors_the_daemon_still_serves_root`]; `slow`: the daemon's
/// `LIVENESS_FAULT`, and the pause after each refusal.
fn out_of_descriptors_root_is_served(slow: Option<(&str, Duration)>) {
    const TRIED: usize = 80;
    let fault = slow.map(|(point, _)| format!("LIVENESS_FAULT={point}"));
    let mut prefix = vec!["env"];
    prefix.extend(fault.as_deref());
    prefix.extend(["prlimit", "--nofile=64:64", "--"]);
    let daemon = Daemon::start_under(
        &prefix,
        None,
        &[
            "--sources",
            "pidfd",
            "--max-connections-per-uid",
            "1000",
            "--max-connections",
            "1000",
        ],
    );
    open_socket_to_everyone(&daemon);
    let mut flood: Vec<ClientAs> = Vec::new();
    let mut refused = 0;
    for _ in 0..TRIED {
        let mut client = ClientAs::connect(&daemon, FLOODER);
        match client.request(&json!({"op": "status"})) {
            Some(reply) if reply["ok"] == true => {}
            Some(reply) => {
                assert_eq!(reply["error"]["code"], "too_many_connections", "{reply}");
                let message = reply["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("file descriptors"), "{reply}");
                refused += 1;
                if let Some((_, pause)) = slow {
                    std::thread::sleep(pause);
                }
            }
            None => panic!("a connection closed without a word"),
        }
        flood.push(client);
    }
    assert!(
        refused > 0,
        "the flood never ran the daemon out of descriptors"
    );
    let status = daemon.request(json!({"op": "status"}));
    assert_eq!(status["ok"], true, "root is served: {status}");
    let limits = &status["status"]["limits"]["connections"];
    assert_eq!(limits["refused"]["file_descriptors"], refused, "{limits}");
    assert_eq!(
        limit_lines(&daemon),
        1,
        "one line, not one per refusal:\n{}",
        daemon.log()
    );
}

/// A SIGKILL of the daemon at each point of an end action's start and end, right after
/// its session's owner died: the action runs at most twice (again only once a run may
/// have started its program), never two runs side by side (each holds a lock for its
/// life), and one killed before its program could run runs exactly once. The first
/// process is recorded, committed, before it is let run its program: a daemon killed
/// between the fork and that record leaves a process that exits without running anything.
/// That process still holds the daemon's descriptors until it is first scheduled (here it
/// lingers a second first): the restart waits for it to let go of the state lock and the
/// socket rather than take it for another daemon.
#[test]
fn a_kill_at_any_point_of_an_action_never_runs_it_twice_at_once() {
    if !privileged("a_kill_at_any_point_of_an_action_never_runs_it_twice_at_once") {
        return;
    }
    for (point, runs) in [
        ("before-action-start", 1..=1),
        ("after-action-fork,action-child-lingers", 1..=1),
        ("after-action-spawn", 1..=2),
        ("before-action-commit", 2..=2),
    ] {
        let marks = tempfile::tempdir().expect("temp dir");
        let log = marks.path().join("runs");
        let lock = marks.path().join("lock");
        let script = format!(
            "exec 9>>{lock}; if flock -n 9; then echo \"run $$ ${{LIVENESS_RESUMED:-0}}\" >> {log}; \
             else echo \"overlap $$\" >> {log}; fi; [ -n \"$LIVENESS_RESUMED\" ] || sleep 5",
            lock = lock.display(),
            log = log.display()
        );
        let state = tempfile::tempdir().expect("temp dir");
        let fault = format!("LIVENESS_FAULT={point}");
        let mut daemon =
            Daemon::start_under(&["env", &fault], Some(state.path().join("state")), &[]);
        let mut owner = Orphan::spawn(&["exit", "0"]);
        let reply = daemon.request(json!({"op": "register", "session": "s",
            "owner": {"pid": owner.pid},
            "on_end_run": [{"argv": ["/bin/sh", "-c", script]}]}));
        assert_eq!(reply["ok"], true, "{reply}");
        owner.release();
        assert!(
            eventually(Duration::from_secs(30), || daemon.exited().is_some()),
            "{point}: the daemon did not die there:\n{}",
            daemon.log()
        );
        let died_at = point.split(',').next().unwrap_or(point);
        assert!(daemon.log().contains(died_at), "{point}:\n{}", daemon.log());
        let again = Daemon::start_with_state(Some(state.path().join("state")), &[]);
        if point.contains("lingers") {
            assert!(
                again
                    .log()
                    .contains("a child it forked still holds its lock"),
                "{point}: the restart did not wait for the lingering child:\n{}",
                again.log()
            );
        }
        let session = again.wait_finalized("s", None);
        // Anything a run left behind had its chance to write.
        std::thread::sleep(QUIET);
        let lines: Vec<String> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(
            lines.iter().all(|line| line.starts_with("run ")),
            "{point}: two runs side by side: {lines:?}"
        );
        assert!(
            runs.contains(&lines.len()),
            "{point}: {} runs, not {runs:?}: {lines:?}",
            lines.len()
        );
        let outcome = &session["actions"][0]["outcome"];
        assert_eq!(outcome["exit"]["code"], 0, "{point}: {outcome}");
        eprintln!("{point}: {lines:?}");
    }
}
