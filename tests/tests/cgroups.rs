//! Session cgroups (docs/cgroups.md) against a real daemon. On a host without usable
//! cgroup2 controllers (this project's development machines: a hybrid hierarchy) a
//! registration asking for a cgroup succeeds without one, with a warning, and status and
//! doctor say why. Where cgroup2 has them (the `cargo xtask vm-test` guests mount it, with
//! `LIVENESS_REQUIRE_CGROUP2=1`), a session's cgroup has its limits and its owner.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::{Value, json};

use integration_tests::{ClientAs, Daemon};

/// Another user, who registers a cgroup session of her own.
const MALLORY: u32 = 61_072;

/// The host's cgroup2 mount and the controllers its root offers, as the test reads them
/// itself from its mountinfo (not through the code under test).
fn host_cgroup2() -> Option<(PathBuf, Vec<String>)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo.lines().find(|l| l.contains(" - cgroup2 "))?;
    let mount = PathBuf::from(line.split(' ').nth(4).unwrap());
    let controllers = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap();
    Some((
        mount,
        controllers.split_whitespace().map(str::to_owned).collect(),
    ))
}

fn usable(controllers: &[String]) -> bool {
    ["memory", "pids"]
        .iter()
        .all(|c| controllers.iter().any(|h| h == c))
}

/// The host's usable cgroup2 mount; `None` (the test is skipped, with a note) where there
/// is none, unless `LIVENESS_REQUIRE_CGROUP2=1`, where that is a failure.
fn usable_host(test: &str) -> Option<PathBuf> {
    let found = host_cgroup2();
    match found {
        Some((mount, controllers)) if usable(&controllers) => return Some(mount),
        _ if std::env::var("LIVENESS_REQUIRE_CGROUP2").as_deref() == Ok("1") => {
            panic!(
                "{test}: LIVENESS_REQUIRE_CGROUP2=1 but the host has no usable cgroup2: {found:?}"
            )
        }
        _ => eprintln!("SKIPPED {test}: no cgroup2 with memory and pids here: {found:?}"),
    }
    None
}

fn sleeper() -> Child {
    Command::new("sleep").arg("600").spawn().unwrap()
}

fn status_cgroup(daemon: &Daemon) -> Value {
    let reply = daemon.request(json!({"op": "status"}));
    reply["status"]["cgroup"].clone()
}

/// Registration with `--cgroup` succeeds, warns with `reason`, and the session has no
/// cgroup; bad limits are refused and register nothing.
fn registers_without_a_cgroup(daemon: &Daemon, reason: &str) {
    let mut owner = sleeper();
    let pid = owner.id().to_string();
    let out = daemon.cli(&[
        "register",
        "--session",
        "plain",
        "--owner-pid",
        &pid,
        "--cgroup",
        "--memory-max",
        "32M",
        "--tasks-max",
        "64",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the session has no cgroup"), "{stderr}");
    assert!(stderr.contains(reason), "{stderr}");
    assert_eq!(daemon.session("plain")["cgroup"], Value::Null);

    // Bad input: a clear error, nothing registered.
    let zero = daemon.cli(&[
        "register",
        "--session",
        "zero",
        "--owner-pid",
        &pid,
        "--cgroup",
        "--memory-max",
        "0",
    ]);
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("not a size between"));
    let without = daemon.cli(&[
        "register",
        "--session",
        "limits-only",
        "--owner-pid",
        &pid,
        "--tasks-max",
        "5",
    ]);
    assert!(!without.status.success());
    for cgroup in [
        json!({"tasks_max": 0}),
        json!({"memory_max": 1, "swap_max": 1}),
        json!("yes"),
    ] {
        let reply = daemon.request(json!({
            "op": "register", "session": "raw", "owner": {"pid": owner.id()}, "cgroup": cgroup,
        }));
        assert_eq!(reply["ok"], false, "{cgroup}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_request", "{reply}");
    }
    let missing = daemon.request(json!({"op": "get", "session": "raw"}));
    assert_eq!(missing["ok"], false, "{missing}");
    owner.kill().unwrap();
    owner.wait().unwrap();
}

/// This machine's kind of host: cgroup2 mounted, its controllers bound to cgroup v1.
#[test]
fn a_hybrid_host_registers_without_a_cgroup_and_says_why() {
    let Some((mount, controllers)) = host_cgroup2().filter(|(_, c)| !usable(c)) else {
        eprintln!("SKIPPED: the host's cgroup2 is not a hybrid one without controllers");
        return;
    };
    let daemon = Daemon::start(&[]);
    let cgroup = status_cgroup(&daemon);
    assert_eq!(cgroup["usable"], false, "{cgroup}");
    assert_eq!(cgroup["mount"], mount.display().to_string());
    assert_eq!(cgroup["controllers"], json!(controllers));
    let reason = cgroup["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.contains("has no memory or pids controller"),
        "{reason}"
    );
    assert!(reason.contains("hybrid host"), "{reason}");
    assert!(
        !mount.join("liveness.slice").exists(),
        "nothing is made on a host that cannot use it"
    );

    let doctor = daemon.cli(&["doctor"]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        text.contains(&format!("Cgroups: none for sessions: {reason}")),
        "{text}"
    );
    let status = daemon.cli(&["status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("Cgroups: none for sessions"));
    let json = daemon.cli(&["--json", "doctor"]);
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["daemon"]["cgroup"]["reason"], reason);

    registers_without_a_cgroup(&daemon, &reason);
}

/// Any host: a daemon in a mount namespace without the cgroup2 mount finds none.
#[test]
fn without_a_cgroup2_mount_registration_still_succeeds() {
    let Some((mount, _)) = host_cgroup2() else {
        eprintln!("SKIPPED: no cgroup2 mount to hide");
        return;
    };
    let hide = format!("umount -l {} && exec \"$@\"", mount.display());
    let daemon = Daemon::start_under(
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &hide,
            "sh",
        ],
        None,
        &[],
    );
    let cgroup = status_cgroup(&daemon);
    assert_eq!(cgroup["usable"], false, "{cgroup}");
    let reason = cgroup["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.starts_with("no cgroup2 file system is mounted"),
        "{reason}"
    );
    registers_without_a_cgroup(&daemon, &reason);
}

/// The directory of a session's cgroup, from `get`.
fn cgroup_of(daemon: &Daemon, id: &str) -> PathBuf {
    let session = daemon.session(id);
    PathBuf::from(
        session["cgroup"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{session}")),
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_session_cgroup_has_its_limits_and_its_owner_and_a_name_of_the_daemons() {
    let Some(mount) = usable_host("a_session_cgroup_has_its_limits") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let cgroup = status_cgroup(&daemon);
    assert_eq!(cgroup["usable"], true, "{cgroup}");
    let subtree = mount.join("liveness.slice");
    assert_eq!(cgroup["subtree"], subtree.display().to_string());

    // An id that would be a path (and a shell's command) never reaches the file system.
    let id = "../../evil/$(id) *";
    let mut owner = sleeper();
    let reply = daemon.request(json!({
        "op": "register", "session": id, "owner": {"pid": owner.id()},
        "cgroup": {"memory_max": 33554432, "tasks_max": 16},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, id);
    assert_eq!(path.parent(), Some(subtree.as_path()));
    assert!(
        path.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("s0-"),
        "{path:?}"
    );
    assert_eq!(read(&path.join("memory.max")).trim(), "33554432");
    assert_eq!(read(&path.join("pids.max")).trim(), "16");
    assert_eq!(
        read(&path.join("cgroup.procs")).trim(),
        owner.id().to_string()
    );

    // Another user's session: her owner moves, and the cgroup stays root's to write.
    let mallory = ClientAs::connect(&daemon, MALLORY);
    let mut mallory = mallory;
    let reply = mallory
        .request(&json!({"op": "register", "session": "m", "owner": {"pid": mallory.0.pid()}, "cgroup": {}}))
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    let hers = PathBuf::from(reply["session"]["cgroup"]["path"].as_str().unwrap());
    assert!(
        hers.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("s{MALLORY}-"))
    );
    assert_eq!(
        read(&hers.join("cgroup.procs")).trim(),
        mallory.0.pid().to_string()
    );
    assert_eq!(read(&hers.join("memory.max")).trim(), "max");
    for file in ["memory.max", "pids.max", "cgroup.procs"] {
        let meta = std::fs::metadata(hers.join(file)).unwrap();
        assert_eq!(meta.uid(), 0, "{file}");
        assert_eq!(meta.mode() & 0o022, 0, "{file} is writable by others");
    }
    owner.kill().unwrap();
    owner.wait().unwrap();
}

/// A memory hog under `memory_max` 32 MiB is OOM-killed inside its session's cgroup: the
/// cgroup's own `memory.events` counts the kill, its peak is of the order of the limit, and
/// the session's end names its cgroup as the one whose limit was reached.
#[test]
fn a_hog_over_its_sessions_memory_max_is_oom_killed_inside_the_session_cgroup() {
    let Some(_) = usable_host("a_hog_over_its_sessions_memory_max") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let mut hog = Command::new(integration_tests::binary("dying"))
        .arg("hog")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let reply = daemon.request(json!({
        "op": "register", "session": "hog", "owner": {"pid": hog.id()},
        "cgroup": {"memory_max": 32 << 20},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "hog");
    // Its stdin's end starts the allocation.
    drop(hog.stdin.take());
    let session = daemon.wait_ended("hog");
    assert_eq!(hog.wait().unwrap().to_string(), "signal: 9 (SIGKILL)");
    let events = read(&path.join("memory.events"));
    let oom_kill: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{events}"));
    assert!(oom_kill >= 1, "{events}");
    if let Ok(peak) = std::fs::read_to_string(path.join("memory.peak")) {
        let peak: u64 = peak.trim().parse().unwrap();
        assert!((24 << 20..=32 << 20).contains(&peak), "memory.peak {peak}");
    }
    if daemon.source_status("ebpf")["state"] == "active" {
        assert_eq!(session["cause"]["kind"], "oom", "{session}");
        assert_eq!(session["cause"]["scope"], "cgroup", "{session}");
        let named = session["cause"]["cgroup"].as_str().unwrap_or_default();
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(
            named.ends_with(&format!("/liveness.slice/{name}")),
            "{session}"
        );
    }
}
