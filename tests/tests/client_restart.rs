//! The client library and the CLI built on it across a daemon restart: the crate's example,
//! `liveness wait` and `liveness watch --exec` keep going when livenessd is SIGTERMed and
//! started again in the middle, and see each end once.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use integration_tests::{Daemon, Orphan, binary, eventually};
use serde_json::json;

/// Waits until `session` is registered and active.
fn until_active(daemon: &Daemon, session: &str) {
    let active = eventually(Duration::from_secs(15), || {
        let reply = daemon.request(json!({"op": "get", "session": session}));
        reply["ok"] == true && reply["session"]["phase"] == "active"
    });
    assert!(active, "{session} was never registered:\n{}", daemon.log());
}

/// SIGTERM (the daemon says goodbye to every subscriber), then the same daemon again, up
/// to watching its `owners` live owners again (an owner that died before that would be
/// found dead by the start-up reconcile, which cannot know its exit status).
fn restart(daemon: &mut Daemon, owners: u64) {
    let status = daemon.stop();
    assert!(status.success(), "livenessd stopped badly: {status}");
    daemon.restart();
    let watching = eventually(Duration::from_secs(15), || {
        daemon.request(json!({"op": "status"}))["status"]["monitor"]["tracked"]
            .as_u64()
            .is_some_and(|tracked| tracked >= owners)
    });
    assert!(
        watching,
        "the restarted daemon does not watch its owners:\n{}",
        daemon.log()
    );
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("wait for the client")
}

#[test]
fn the_crate_example_prints_the_exit_status_across_a_daemon_restart() {
    let example = binary("wait_for_exit");
    let mut daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["exit", "7"]);
    let waiter = Command::new(&example)
        .arg("example-session")
        .arg(owner.pid.to_string())
        .arg(&daemon.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the example");
    until_active(&daemon, "example-session");
    restart(&mut daemon, 1);
    owner.release();
    let output = finish(waiter);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed ({}): {stdout}{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    assert_eq!(
        stdout.trim(),
        "example-session: exited with code 7",
        "the example printed the wrong status"
    );
}

#[test]
fn wait_survives_a_daemon_restart_and_reports_the_exit_code() {
    let mut daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["exit", "3"]);
    let pid = owner.pid.to_string();
    let registered = daemon.cli(&["register", "--session", "w", "--owner-pid", &pid]);
    assert!(registered.status.success(), "register: {registered:?}");
    let waiter = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["wait", "--session", "w", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run liveness wait");
    // The waiter is subscribed once the daemon counts a subscriber.
    let subscribed = eventually(Duration::from_secs(15), || {
        daemon.request(json!({"op": "status"}))["status"]["subscribers"] == 1
    });
    assert!(subscribed, "wait never subscribed:\n{}", daemon.log());
    restart(&mut daemon, 1);
    owner.release();
    let output = finish(waiter);
    assert_eq!(
        output.status.code(),
        Some(1),
        "wait should exit 1 for a non-zero exit code: {output:?}"
    );
    let session: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("wait --json prints the session");
    assert_eq!(session["exit"]["code"], 3, "{session}");
}

#[test]
fn watch_exec_runs_once_per_end_across_a_daemon_restart() {
    let mut daemon = Daemon::start(&[]);
    let out = daemon.dir.path().join("ended.txt");
    let cursor = daemon.dir.path().join("cursor");
    let mut first = Orphan::spawn(&["exit", "4"]);
    let mut second = Orphan::spawn(&["exit", "5"]);
    for (id, owner) in [("one", &first), ("two", &second)] {
        let pid = owner.pid.to_string();
        let registered = daemon.cli(&["register", "--session", id, "--owner-pid", &pid]);
        assert!(registered.status.success(), "register {id}: {registered:?}");
    }
    let command = format!(
        "echo \"$LIVENESS_SESSION $LIVENESS_EXIT_CODE\" >> {}",
        out.display()
    );
    let mut watcher = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--since", "0", "--exec", &command, "--cursor"])
        .arg(&cursor)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run liveness watch");
    let lines = || std::fs::read_to_string(&out).unwrap_or_default();
    first.release();
    assert!(
        eventually(Duration::from_secs(15), || lines().contains("one 4")),
        "the first end was not handled: {:?}\n{}",
        lines(),
        daemon.log()
    );
    restart(&mut daemon, 1);
    second.release();
    let both = eventually(Duration::from_secs(45), || lines().contains("two 5"));
    let _ = watcher.kill();
    let stderr = finish(watcher).stderr;
    assert!(
        both,
        "the watcher did not come back after the restart: {:?}\n{}\n{}",
        lines(),
        String::from_utf8_lossy(&stderr),
        daemon.log()
    );
    assert_eq!(
        lines(),
        "one 4\ntwo 5\n",
        "each end runs the command exactly once"
    );
}

#[test]
fn the_async_client_waits_for_an_end_across_a_daemon_restart() {
    use liveness_client::nonblocking::AsyncClient;
    use liveness_client::{Owner, Registration};

    let mut daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["signal", "15"]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let socket = daemon.socket.clone();
    let (registered_tx, registered_rx) = std::sync::mpsc::sync_channel(1);
    let pid = owner.pid;
    let waiter = std::thread::spawn(move || {
        runtime.block_on(async {
            let mut client = AsyncClient::connect(&socket).await?;
            client
                .register(&Registration::new("async", Owner::Pid(pid)))
                .await?;
            let events = client.subscribe(
                None,
                liveness_client::Filter {
                    session: Some("async".into()),
                    uid: None,
                },
            );
            let mut events = events.await?;
            registered_tx.send(()).expect("the test waits");
            // The stream, not a look-up, must carry the end across the restart.
            loop {
                if let liveness_client::Item::Event(event) = events.next_item().await?
                    && event.kind == liveness_common::session::EventKind::Ended
                {
                    return Ok::<_, liveness_client::ClientError>(event);
                }
            }
        })
    });
    registered_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the async client registered and subscribed");
    restart(&mut daemon, 1);
    owner.release();
    let event = waiter
        .join()
        .expect("the async waiter")
        .unwrap_or_else(|e| panic!("the async subscription failed: {e}\n{}", daemon.log()));
    assert_eq!(event.session, "async");
    assert_eq!(
        event.exit.map(|exit| exit.to_string()).as_deref(),
        Some("killed by signal 15"),
        "{event:?}"
    );
}
