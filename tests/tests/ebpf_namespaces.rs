//! The eBPF source from inside a child PID namespace (a container without the host's PID
//! namespace): the program translates each exiting process's pid into the daemon's
//! namespace, so the daemon's own pids find their deaths.

use std::process::Command;
use std::time::Duration;

use integration_tests::{Daemon, binary, eventually, privileged};
use serde_json::{Value, json};

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
        .split_ascii_whitespace()
        .map(|child| child.parse().expect("a PID"))
        .collect()
}

/// Runs `sh -c script` inside the PID and mount namespaces of `target`.
fn in_namespace_of(target: u32, script: &str) -> String {
    let output = Command::new("nsenter")
        .args([
            "-t",
            &target.to_string(),
            "-p",
            "-m",
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run nsenter: {e}"));
    assert!(output.status.success(), "nsenter {script:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn a_daemon_in_a_child_pid_namespace_sees_deaths_through_ebpf() {
    if !privileged("a_daemon_in_a_child_pid_namespace_sees_deaths_through_ebpf") {
        return;
    }
    let daemon = Daemon::start_under(
        &["unshare", "--pid", "--fork", "--mount-proc"],
        None,
        &["--sources", "ebpf"],
    );
    let ebpf = daemon.source_status("ebpf");
    assert_eq!(ebpf["state"], "active", "{ebpf}");
    assert_eq!(ebpf["self_test"]["passed"], true, "{ebpf}");

    // `unshare --fork` runs the daemon as its only child, PID 1 of the new namespace.
    let livenessd = children_of(daemon.pid())[0];
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    // The owner and the client both live in the daemon's namespace; the pid registered is
    // the one the daemon sees, which differs from the host's.
    let registered = in_namespace_of(
        livenessd,
        &format!(
            "sleep 1000 </dev/null >/dev/null 2>&1 & {} --socket {} register --session contained --owner-pid $! --json",
            binary("liveness").display(),
            daemon.socket.display()
        ),
    );
    let session: Value = serde_json::from_str(&registered)
        .unwrap_or_else(|e| panic!("register printed {registered:?}: {e}"));
    assert_eq!(session["phase"], "active", "{session}");
    let pid = session["owner"]["pid"].as_u64().expect("owner pid");
    assert!(
        pid < 100,
        "the owner's pid must be the namespace's (small), not the host's: {session}"
    );

    in_namespace_of(livenessd, &format!("kill -9 {pid}"));
    let ended = loop {
        let line = stream
            .next_within(Duration::from_secs(20))
            .expect("the session must end");
        if line["event"]["kind"] == "session.ended" {
            break line["event"].clone();
        }
    };
    assert_eq!(ended["session"], "contained", "{ended}");
    assert_eq!(ended["detected_by"], "ebpf", "{ended}");
    assert_eq!(
        ended["exit"],
        json!({"kind": "signaled", "signal": 9, "core_dumped": false}),
        "{ended}"
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            daemon.request(json!({"op": "status"}))["status"]["monitor"]["tracked"] == 0
        }),
        "the dead owner stays tracked"
    );
}
