//! The event stream: resuming, retention gaps, and slow subscribers.

use std::io::Read;
use std::time::Duration;

use integration_tests::{Conn, Daemon, Orphan, TestprocAs, eventually};
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(10);

fn subscribe(daemon: &Daemon, request: Value) -> Conn {
    let mut conn = daemon.connect();
    let ack = conn.request(request);
    assert_eq!(ack["ok"], true, "{ack}");
    conn
}

fn seqs(conn: &mut Conn, count: usize) -> Vec<u64> {
    (0..count)
        .map(|_| {
            let line = conn.next_within(ARRIVAL).expect("an event");
            line["event"]["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("not an event: {line}"))
        })
        .collect()
}

fn register(conn: &mut Conn, session: &str, pid: u32) {
    let reply = conn.request(json!({"op": "register", "session": session, "owner": {"pid": pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
}

#[test]
fn a_consumer_resumes_with_since_and_gets_exactly_what_it_missed() {
    let daemon = Daemon::start(&[]);
    let owner = Orphan::spawn(&["exit", "0"]);
    let mut control = daemon.connect();
    let mut stream = subscribe(&daemon, json!({"op": "subscribe", "since": 0}));
    register(&mut control, "a", owner.pid);
    register(&mut control, "b", owner.pid);
    assert_eq!(seqs(&mut stream, 2), [1, 2]);
    drop(stream);

    register(&mut control, "c", owner.pid);
    assert_eq!(
        control.request(json!({"op": "end", "session": "a"}))["session"]["reason"],
        "stopped"
    );
    register(&mut control, "d", owner.pid);

    let mut resumed = subscribe(&daemon, json!({"op": "subscribe", "since": 2}));
    let replayed: Vec<Value> = (0..3)
        .map(|_| resumed.next_within(ARRIVAL).expect("replayed event"))
        .collect();
    let got: Vec<(u64, &str, &str)> = replayed
        .iter()
        .map(|l| {
            (
                l["event"]["seq"].as_u64().unwrap(),
                l["event"]["kind"].as_str().unwrap(),
                l["event"]["session"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (3, "session.registered", "c"),
            (4, "session.ended", "a"),
            (5, "session.registered", "d")
        ]
    );
    // Then live, without a gap or a duplicate: a duplicate would come before the next.
    register(&mut control, "e", owner.pid);
    register(&mut control, "f", owner.pid);
    assert_eq!(seqs(&mut resumed, 2), [6, 7]);

    let mut one_session = subscribe(
        &daemon,
        json!({"op": "subscribe", "since": 0, "session": "a"}),
    );
    assert_eq!(seqs(&mut one_session, 2), [1, 4], "session filter");
}

#[test]
fn a_consumer_behind_the_retention_window_is_told_of_the_gap() {
    let mut daemon = Daemon::start(&["--retain-events", "2"]);
    let owner = Orphan::spawn(&["exit", "0"]);
    let mut control = daemon.connect();
    for session in ["a", "b", "c", "d", "e"] {
        register(&mut control, session, owner.pid);
    }
    drop(control);
    // Retention runs at start (and periodically).
    assert!(daemon.stop().success());
    daemon.restart();
    let mut stream = subscribe(&daemon, json!({"op": "subscribe", "since": 1}));
    let gap = stream.next_within(ARRIVAL).expect("gap");
    assert_eq!(gap, json!({"gap": {"since": 1, "pruned_through": 3}}));
    assert_eq!(seqs(&mut stream, 2), [4, 5]);

    let mut current = subscribe(&daemon, json!({"op": "subscribe", "since": 3}));
    assert_eq!(seqs(&mut current, 2), [4, 5], "no gap inside the window");
}

#[test]
fn a_stalled_subscriber_delays_no_one_and_is_told_it_lagged() {
    let daemon = Daemon::start(&["--subscriber-queue", "16"]);
    let mut owner = Orphan::spawn(&["exit", "0"]);
    let mut stalled = subscribe(&daemon, json!({"op": "subscribe"}));
    // Enough events to fill the stalled client's socket buffer and its queue; the ones after
    // them end every session when the owner dies.
    let count = 3000;
    let mut reader = subscribe(&daemon, json!({"op": "subscribe"}));
    let reading = std::thread::spawn(move || seqs(&mut reader, 2 * count));
    // Once the daemon has dropped the stalled client, it reads what it was sent. Waiting
    // longer would let the daemon's 10 s write timeout disconnect it without a word, as it
    // does with a client that never reads again.
    let mut watcher = daemon.connect();
    let draining = std::thread::spawn(move || {
        let lagged = eventually(ARRIVAL * 3, || {
            let status = watcher.request(json!({"op": "status"}));
            status["status"]["counters"]["lagged_subscribers"].as_u64() >= Some(1)
        });
        assert!(lagged, "the stalled subscriber was never dropped");
        std::iter::from_fn(|| stalled.next_within(ARRIVAL)).collect::<Vec<Value>>()
    });
    let mut control = daemon.connect();
    for i in 0..count {
        register(&mut control, &format!("s{i}"), owner.pid);
    }
    // Finalization is not held up by the stalled client either.
    owner.release();
    let got = reading.join().expect("the reading subscriber");
    assert_eq!(
        got,
        (1..=2 * count as u64).collect::<Vec<_>>(),
        "the reading subscriber got everything, in order"
    );
    // The stalled client finds the events it had, then `lagged` with the last one delivered,
    // then the end of the connection.
    let mut lines = draining.join().expect("the stalled subscriber");
    let closing = lines.pop().expect("the stalled stream ends with lagged");
    let delivered: Vec<u64> = lines
        .iter()
        .map(|line| {
            line["event"]["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("not an event: {line}"))
        })
        .collect();
    assert_eq!(
        delivered,
        (1..=delivered.len() as u64).collect::<Vec<_>>(),
        "no event skipped before the lag"
    );
    let last = delivered.len() as u64;
    assert_eq!(closing, json!({"lagged": {"last_delivered": last}}));
    assert!(
        last < count as u64,
        "the stalled client cannot have received everything"
    );
}

/// A subscriber that stops reading in the middle of a line is dropped as lagged, and its
/// connection is closed within the daemon's write timeout (10 s): it holds it no longer.
/// Only a line longer than half the daemon's socket buffer (about 106 KB of its 208 KiB)
/// is ever written in part: here each ended event lists a thousand survivors (about
/// 120 KB), and the registrations between them are small, so the first ended line fits
/// whole and the second is begun and cut where the buffer fills.
#[test]
fn a_subscriber_that_stops_reading_mid_line_is_disconnected() {
    const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
    let daemon = Daemon::start(&["--subscriber-queue", "2"]);
    let mut tree = TestprocAs::spawn(0, &["tree", "1100"]);
    assert_eq!(tree.read_line().as_deref(), Some("ready\n"));
    let mut control = daemon.connect();
    // The whole tree known before the first end, so that each lists its survivors.
    register(&mut control, "known", tree.pid());
    let known = eventually(ARRIVAL * 3, || {
        let request = json!({"op": "processes", "session": "known", "limit": 10_000});
        control.request(request)["processes"]
            .as_array()
            .is_some_and(|listed| listed.len() > 1100)
    });
    assert!(known, "the daemon never knew the whole tree");
    let stalled = subscribe(&daemon, json!({"op": "subscribe"}));
    let lagged = |control: &mut Conn| {
        let status = control.request(json!({"op": "status"}));
        status["status"]["counters"]["lagged_subscribers"].as_u64() >= Some(1)
    };
    for round in 0.. {
        if lagged(&mut control) {
            break;
        }
        assert!(round < 50, "the stalled subscriber was never dropped");
        let session = format!("big-{round}");
        register(&mut control, &session, tree.pid());
        let reply = control.request(json!({"op": "end", "session": session}));
        assert_eq!(reply["ok"], true, "{}", reply["error"]);
        let survivors = &reply["session"]["survivors"]["total"];
        assert!(survivors.as_u64() > Some(1000), "survivors: {survivors}");
    }
    assert!(
        stalled.closed_by_daemon_within(WRITE_TIMEOUT + ARRIVAL),
        "the daemon kept the connection of a lagged subscriber that does not read"
    );

    // What the stalled client had: whole events in order, then the line the daemon began
    // and gave up on.
    let (mut reader, _) = stalled.into_parts();
    let mut got = Vec::new();
    reader.read_to_end(&mut got).expect("read what was sent");
    let got = String::from_utf8(got).expect("UTF-8");
    let (whole, begun) = got.rsplit_once('\n').expect("whole lines first");
    assert!(
        !begun.is_empty(),
        "the stream did not stop in the middle of a line: {} bytes",
        got.len()
    );
    let seqs: Vec<u64> = whole
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("a JSON line");
            line["event"]["seq"].as_u64().expect("an event")
        })
        .collect();
    let first = seqs.first().copied().unwrap_or_default();
    assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>());
}

/// A subscription that ends gives its socket back at once, not when the daemon next
/// publishes: subscribing and hanging up in a loop while nothing happens would otherwise
/// leave one descriptor open in the daemon each time, and run it out of them.
#[test]
fn subscriptions_that_end_leave_no_descriptor_open() {
    let daemon = Daemon::start(&[]);
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
            .expect("the daemon's descriptors")
            .count()
    };
    // Counted once what the daemon opens as it starts (its reserve descriptor, the
    // checkpoint's database and WAL) is open: served a request, and the same count twice,
    // a checkpoint period apart.
    assert_eq!(daemon.request(json!({"op": "status"}))["ok"], true);
    let mut before = descriptors();
    let settled = eventually(ARRIVAL, || {
        std::thread::sleep(Duration::from_millis(500));
        let previous = std::mem::replace(&mut before, descriptors());
        previous == before
    });
    assert!(settled, "the daemon's descriptors never settled: {before}");
    for _ in 0..200 {
        drop(subscribe(&daemon, json!({"op": "subscribe"})));
    }
    let mut after = descriptors();
    let released = eventually(ARRIVAL, || {
        after = descriptors();
        after <= before + 2
    });
    assert!(
        released,
        "{after} descriptors open after 200 subscriptions ended, {before} before"
    );
}

#[test]
fn oversized_and_malformed_lines_get_errors_and_change_nothing() {
    let daemon = Daemon::start(&[]);
    let mut conn = daemon.connect();
    let head =
        |conn: &mut Conn| conn.request(json!({"op": "status"}))["status"]["head_seq"].clone();
    let before = head(&mut conn);

    conn.send_raw(b"{this is not json\n");
    assert_eq!(conn.next_line().unwrap()["error"]["code"], "invalid_json");
    let mut huge = vec![b' '; 70 * 1024];
    huge.extend_from_slice(b"{\"op\":\"status\"}\n");
    conn.send_raw(&huge);
    let reply = conn.next_line().unwrap();
    assert_eq!(reply["error"]["code"], "line_too_long", "{reply}");
    for (request, code, mentions) in [
        (json!({"op": "detonate"}), "invalid_request", "detonate"),
        (
            json!({"op": "get", "sesion": "x"}),
            "invalid_request",
            "sesion",
        ),
        (
            json!({"op": "whose", "pid": "12"}),
            "invalid_request",
            "invalid type",
        ),
        (
            json!({"op": "status", "v": 99, "id": 5}),
            "unsupported_version",
            "99",
        ),
        (
            json!({"op": "register", "session": "x", "owner": {"pid": 999_999_999u32}}),
            "no_owner",
            "999999999",
        ),
        (
            json!({"op": "register", "owner": {"pid": 1}}),
            "invalid_request",
            "session",
        ),
        (
            json!({"op": "register", "session": "", "owner": {"pid": std::process::id()}}),
            "invalid_request",
            "id",
        ),
        (
            json!({"op": "get", "session": "never-registered"}),
            "not_found",
            "never-registered",
        ),
        (
            json!({"op": "end", "session": "never-registered"}),
            "not_found",
            "never-registered",
        ),
        (
            json!({"op": "rename", "session": "never-registered", "to": "x"}),
            "not_found",
            "never-registered",
        ),
    ] {
        let reply = conn.request(request.clone());
        assert_eq!(reply["ok"], false, "{request} -> {reply}");
        assert_eq!(reply["error"]["code"], code, "{request} -> {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(mentions),
            "{request}: message {message:?} should mention {mentions:?}"
        );
    }
    assert_eq!(
        conn.request(json!({"op": "status", "id": "x"}))["id"],
        "x",
        "the connection still works"
    );
    assert_eq!(head(&mut conn), before, "bad input wrote events");
    let reply = conn.request(json!({"op": "list"}));
    assert_eq!(reply["sessions"], json!([]), "bad input created sessions");

    // A client that sends garbage and vanishes mid-line harms no one.
    let mut rude = daemon.connect();
    rude.send_raw(b"{\"op\":\"stat");
    drop(rude);
    assert_eq!(conn.request(json!({"op": "status"}))["ok"], true);
    let mut raw = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    std::io::Write::write_all(&mut raw, b"\n\n").unwrap();
    raw.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = String::new();
    raw.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "blank lines are ignored, not answered");
}

/// Context switches of the daemon's connection threads (tokio's workers) so far.
fn connection_thread_switches(daemon: &Daemon) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.pid())).unwrap();
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "tokio-rt-worker")
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|line| line.contains("ctxt_switches"))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Deaths go to a subscriber that keeps up straight from the engine, and its reads do not
/// wake the daemon's connection threads either: registered for room to write, its socket
/// would wake one each time the subscriber read an event.
#[test]
fn a_subscriber_that_keeps_up_never_wakes_a_connection_thread() {
    const DEATHS: usize = 30;
    let daemon = Daemon::start(&[]);
    let mut control = daemon.connect();
    let mut stream = subscribe(&daemon, json!({"op": "subscribe"}));
    let mut owners: Vec<std::process::Child> = (0..DEATHS)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap()
        })
        .collect();
    for (n, owner) in owners.iter().enumerate() {
        register(&mut control, &format!("s{n}"), owner.id());
        stream.next_event_of("session.registered", &format!("s{n}"), ARRIVAL);
    }
    let before = connection_thread_switches(&daemon);
    for (n, owner) in owners.iter_mut().enumerate() {
        owner.kill().unwrap();
        owner.wait().unwrap();
        stream.next_event_of("session.ended", &format!("s{n}"), ARRIVAL);
    }
    // A blocking-pool thread that ends meanwhile takes its count with it.
    let switches = connection_thread_switches(&daemon).saturating_sub(before);
    assert!(
        switches < DEATHS as u64 / 3,
        "{switches} context switches of connection threads over {DEATHS} deaths"
    );
}
