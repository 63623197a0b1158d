//! Session cgroups (docs/cgroups.md) against a real daemon. On a host without usable
//! cgroup2 controllers (this project's development machines: a hybrid hierarchy) a
//! registration asking for a cgroup succeeds without one, with a warning, and status and
//! doctor say why. Where cgroup2 has them (the `cargo xtask vm-test` guests mount it, with
//! `LIVENESS_REQUIRE_CGROUP2=1`), a session's cgroup has its limits and its owner.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use integration_tests::{ClientAs, Daemon, eventually};
use liveness_proc::mountinfo::cgroup2_mounts;

/// Another user, who registers a cgroup session of her own.
const MALLORY: u32 = 61_072;

/// The host's cgroup2 mount and the controllers its root offers, as the test reads them
/// itself from its mountinfo (not through the code under test).
fn host_cgroup2() -> Option<(PathBuf, Vec<String>)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = (cgroup2_mounts(&mountinfo).unwrap().into_iter().next())?.mount_point;
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
        "--memory-high",
        "24M",
        "--cpu-weight",
        "50",
        "--on-oom",
        "end",
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
    for flags in [
        &["--cgroup", "--cpu-weight", "10001"][..],
        &["--cgroup", "--cpu-weight", "0"],
        &["--cgroup", "--memory-high", "0"],
        &["--cgroup", "--on-oom", "sometimes"],
        &["--on-oom", "end"],
        &["--cpu-weight", "50"],
    ] {
        let mut args = vec![
            "register",
            "--session",
            "bad-flags",
            "--owner-pid",
            pid.as_str(),
        ];
        args.extend(flags);
        let refused = daemon.cli(&args);
        assert!(!refused.status.success(), "{flags:?}");
    }
    for cgroup in [
        json!({"tasks_max": 0}),
        json!({"memory_high": 0}),
        json!({"cpu_weight": 0}),
        json!({"cpu_weight": 10_001}),
        json!({"on_oom": "sometimes"}),
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
    let missing = daemon.request(json!({"op": "get", "session": "bad-flags"}));
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
    // No cgroups, so no one makes them: neither systemd (not the init here) nor the daemon.
    assert!(cgroup.get("manager").is_none(), "{cgroup}");
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
    // The guests' init is not systemd: the daemon writes the cgroups itself, and says why.
    assert_eq!(cgroup["manager"], "cgroupfs", "{cgroup}");
    let why = cgroup["manager_reason"].as_str().unwrap();
    assert!(why.contains("/run/systemd/system does not exist"), "{why}");
    let subtree = mount.join("liveness.slice");
    assert_eq!(cgroup["subtree"], subtree.display().to_string());
    // cpu.weight needs the cpu controller, which a host may not offer.
    let cpu = cgroup["controllers"]
        .as_array()
        .unwrap()
        .contains(&json!("cpu"));

    // An id that would be a path (and a shell's command) never reaches the file system.
    let id = "../../evil/$(id) *";
    let mut owner = sleeper();
    let mut limits = json!({
        "memory_max": 33554432, "tasks_max": 16, "memory_high": 25165824, "on_oom": "end",
    });
    if cpu {
        limits["cpu_weight"] = json!(50);
    }
    let reply = daemon.request(json!({
        "op": "register", "session": id, "owner": {"pid": owner.id()}, "cgroup": limits,
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    for (key, value) in limits.as_object().unwrap() {
        assert_eq!(&reply["session"]["cgroup"][key], value, "{reply}");
    }
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
    assert_eq!(read(&path.join("memory.high")).trim(), "25165824");
    assert_eq!(read(&path.join("memory.oom.group")).trim(), "1");
    if cpu {
        assert_eq!(read(&path.join("cpu.weight")).trim(), "50");
    }
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
    assert_eq!(read(&hers.join("memory.oom.group")).trim(), "0");
    let mut files = vec!["memory.max", "memory.high", "memory.oom.group", "pids.max"];
    files.extend(cpu.then_some("cpu.weight"));
    let before: Vec<String> = files.iter().map(|f| read(&hers.join(f))).collect();
    for file in files.iter().chain(&["cgroup.procs"]) {
        let meta = std::fs::metadata(hers.join(file)).unwrap();
        assert_eq!(meta.uid(), 0, "{file}");
        assert_eq!(meta.mode() & 0o022, 0, "{file} is writable by others");
    }
    // She cannot raise her limits by registering her session again...
    let reply = mallory
        .request(
            &json!({"op": "register", "session": "m", "owner": {"pid": mallory.0.pid()},
            "cgroup": {"memory_high": 1, "tasks_max": 1, "cpu_weight": 10_000, "on_oom": "end"}}),
        )
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    // ...nor by writing them, nor move a process out of her cgroup or into another's.
    let writes = [
        format!("echo 1 > {}/memory.high", hers.display()),
        format!("echo max > {}/pids.max", hers.display()),
        format!("echo 10000 > {}/cpu.weight", hers.display()),
        format!("echo 0 > {}/memory.oom.group", path.display()),
        format!(
            "echo {} > {}/cgroup.procs",
            mallory.0.pid(),
            subtree.display()
        ),
        format!("echo {} > {}/cgroup.procs", mallory.0.pid(), path.display()),
        format!("echo {} > {}/cgroup.procs", owner.id(), hers.display()),
    ];
    for write in &writes {
        let status = Command::new("sh")
            .args(["-c", write])
            .uid(MALLORY)
            .gid(MALLORY)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "as {MALLORY}: {write}");
    }
    let after: Vec<String> = files.iter().map(|f| read(&hers.join(f))).collect();
    assert_eq!(before, after, "{files:?}");
    assert_eq!(read(&path.join("memory.oom.group")).trim(), "1");
    assert_eq!(
        read(&hers.join("cgroup.procs")).trim(),
        mallory.0.pid().to_string()
    );
    assert_eq!(
        read(&path.join("cgroup.procs")).trim(),
        owner.id().to_string()
    );
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
    let usage = wait_reclaimed(&daemon, "hog", &path);
    assert!(
        usage["memory_events"]["oom_kill"].as_u64() >= Some(1),
        "{usage}"
    );
    assert!(usage["memory_events"]["max"].as_u64() >= Some(1), "{usage}");
    match usage["memory_peak"].as_u64() {
        Some(peak) => assert!((24 << 20..=32 << 20).contains(&peak), "{usage}"),
        // 5.10-5.18: no memory.peak, and so a null, never a made-up number.
        None => assert_eq!(status_cgroup(&daemon)["peak"], false, "{usage}"),
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

/// `on_oom: end`: a hog that joined a session's cgroup takes the whole session with it
/// when it is OOM-killed there (`memory.oom.group`): the owner, asleep and small, is
/// killed too, which ends the session; a session of `continue` beside it is untouched.
#[test]
fn on_oom_end_an_oom_kill_in_the_session_cgroup_ends_the_session() {
    let Some(_) = usable_host("on_oom_end_an_oom_kill_in_the_session_cgroup") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let mut owner = sleeper();
    let mut other = sleeper();
    for (id, pid, on_oom) in [
        ("oom-end", owner.id(), "end"),
        ("other", other.id(), "continue"),
    ] {
        let reply = daemon.request(json!({
            "op": "register", "session": id, "owner": {"pid": pid},
            "cgroup": {"memory_max": 32 << 20, "on_oom": on_oom},
        }));
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let path = cgroup_of(&daemon, "oom-end");
    let mut hog = Command::new(integration_tests::binary("dying"))
        .arg("hog")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(path.join("cgroup.procs"), hog.id().to_string()).unwrap();
    drop(hog.stdin.take());
    let session = daemon.wait_ended("oom-end");
    assert_eq!(hog.wait().unwrap().to_string(), "signal: 9 (SIGKILL)");
    assert_eq!(owner.wait().unwrap().to_string(), "signal: 9 (SIGKILL)");
    let usage = wait_reclaimed(&daemon, "oom-end", &path);
    assert!(
        usage["memory_events"]["oom_kill"].as_u64() >= Some(2),
        "{usage}"
    );
    if daemon.source_status("ebpf")["state"] == "active" {
        assert_eq!(session["cause"]["kind"], "oom", "{session}");
    }
    assert_eq!(daemon.session("other")["phase"], "active");
    assert_eq!(other.try_wait().unwrap(), None);
    other.kill().unwrap();
    other.wait().unwrap();
}

/// Waits until the session's `cgroup.usage` is stored and its cgroup is gone (30 s: the
/// guests are emulated), and returns that usage.
fn wait_reclaimed(daemon: &Daemon, id: &str, path: &Path) -> Value {
    let mut last = Value::Null;
    let done = eventually(Duration::from_secs(30), || {
        last = daemon.session(id);
        !last["cgroup"]["usage"].is_null() && !path.exists()
    });
    assert!(
        done,
        "{id}'s cgroup {} was not reclaimed: {last}\n{}",
        path.display(),
        daemon.log()
    );
    last["cgroup"]["usage"].clone()
}

/// An owner (`sh`) that started a member (`sleep`) in its tree; the member's pid.
fn owner_with_member() -> (Child, u32) {
    let mut owner = Command::new("sh")
        .args(["-c", "sleep 600 & echo $!; wait"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(owner.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (owner, line.trim().parse().unwrap())
}

fn sigkill(pid: u32) {
    // SAFETY: a process of this test's.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

/// A session's cgroup outlives its end only as long as a member is left in it: it is
/// removed once the last is gone, after what it counted is stored with the session.
#[test]
fn an_ended_sessions_cgroup_is_removed_once_empty_with_its_counters_stored() {
    let Some(_) = usable_host("an_ended_sessions_cgroup_is_removed") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let (mut owner, member) = owner_with_member();
    let reply = daemon.request(json!({
        "op": "register", "session": "w", "owner": {"pid": owner.id()}, "cgroup": {},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "w");
    // The registration moved the member in already; written again, it stays there.
    std::fs::write(path.join("cgroup.procs"), member.to_string()).unwrap();
    let reply = daemon.request(json!({"op": "end", "session": "w"}));
    assert_eq!(reply["ok"], true, "{reply}");
    owner.kill().unwrap();
    owner.wait().unwrap();
    // Ended, but a member is left: the cgroup stays, uncounted.
    assert_eq!(daemon.session("w")["phase"], "ended");
    assert!(path.exists());
    sigkill(member);
    let usage = wait_reclaimed(&daemon, "w", &path);
    assert!(usage["cpu_usec"].is_u64(), "{usage}");
    assert_eq!(usage["memory_events"]["oom_kill"], 0, "{usage}");
    if let Some(pids_peak) = usage["pids_peak"].as_u64() {
        // The owner and its sleep.
        assert!(pids_peak >= 2, "{usage}");
    }
    assert_eq!(
        usage["memory_peak"].is_u64(),
        status_cgroup(&daemon)["peak"] == true,
        "{usage}"
    );
    // Once only: the stored counters stay as they were.
    assert_eq!(daemon.session("w")["cgroup"]["usage"], usage);
    // The member the cgroup held at the end is a listed survivor: nothing unlisted.
    assert!(daemon.session("w")["cgroup"]["unlisted"].is_null());
    let text = daemon.cli(&["get", "--session", "w"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("    Cgroup: peak memory "), "{text}");
}

/// What a session's cgroup held at its end besides the survivors its tree lists is stored
/// with its counters (`cgroup.unlisted`): here a process root wrote into the cgroup, while
/// the owner's member is a survivor and not unlisted. `get` names it.
#[test]
fn a_process_in_the_cgroup_that_is_no_member_is_unlisted_at_the_end() {
    let Some(_) = usable_host("a_process_in_the_cgroup_that_is_no_member") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let (mut owner, member) = owner_with_member();
    let reply = daemon.request(json!({
        "op": "register", "session": "held", "owner": {"pid": owner.id()}, "cgroup": {},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "held");
    let mut stranger = sleeper();
    let key = json!({
        "pid": stranger.id(),
        "start_ticks": integration_tests::start_ticks(stranger.id()).unwrap(),
    });
    std::fs::write(path.join("cgroup.procs"), stranger.id().to_string()).unwrap();
    owner.kill().unwrap();
    owner.wait().unwrap();
    let ended = daemon.wait_ended("held");
    let listed: Vec<&Value> = (ended["survivors"]["members"].as_array().unwrap().iter())
        .map(|m| &m["pid"])
        .collect();
    assert_eq!(listed, [&json!(member)], "{ended}");
    // Unlisted, and still in the cgroup after the end.
    assert!(procs(&path).contains(&stranger.id()));
    sigkill(member);
    stranger.kill().unwrap();
    stranger.wait().unwrap();
    wait_reclaimed(&daemon, "held", &path);
    let session = daemon.session("held");
    assert_eq!(
        session["cgroup"]["unlisted"],
        json!({"total": 1, "processes": [key]}),
        "{session}"
    );
    let text = daemon.cli(&["get", "--session", "held"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "Unlisted: 1 process(es) in its cgroup at its end, none of its tree: pid {}",
            stranger.id()
        )),
        "{text}"
    );
}

/// A daemon SIGKILLed while 50 cgroup sessions live, whose owners then die, and a cgroup
/// the store does not know: after a restart each session is ended once, its counters
/// stored, and no cgroup is left.
#[test]
fn a_killed_daemons_session_cgroups_are_reclaimed_after_its_restart() {
    const SESSIONS: usize = 50;
    let Some(mount) = usable_host("a_killed_daemons_session_cgroups") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::start_with_state(Some(state.clone()), &[]);
    let mut owners = Vec::new();
    let mut paths = Vec::new();
    for i in 0..SESSIONS {
        let (owner, member) = owner_with_member();
        let id = format!("k{i}");
        let reply = daemon.request(json!({
            "op": "register", "session": id, "owner": {"pid": owner.id()},
            "cgroup": {"tasks_max": 8},
        }));
        assert_eq!(reply["ok"], true, "{reply}");
        let path = cgroup_of(&daemon, &id);
        // The registration moved the member in already; written again, it stays there.
        std::fs::write(path.join("cgroup.procs"), member.to_string()).unwrap();
        owners.push((owner, member));
        paths.push(path);
    }
    let stray = mount.join("liveness.slice").join("stray");
    std::fs::create_dir(&stray).unwrap();
    daemon.kill9();
    for (owner, member) in &mut owners {
        owner.kill().unwrap();
        owner.wait().unwrap();
        sigkill(*member);
    }
    daemon.restart();
    for (i, path) in paths.iter().enumerate() {
        let id = format!("k{i}");
        assert_eq!(daemon.wait_ended(&id)["detected_by"], "reconcile");
        let usage = wait_reclaimed(&daemon, &id, path);
        assert!(usage["cpu_usec"].is_u64(), "{usage}");
    }
    assert!(
        eventually(Duration::from_secs(30), || !stray.exists()),
        "{}",
        daemon.log()
    );
    let mut ended: Vec<String> = replay(&daemon)
        .into_iter()
        .filter(|e| e["kind"] == "session.ended")
        .map(|e| e["session"].as_str().unwrap().to_owned())
        .collect();
    ended.sort();
    let mut expected: Vec<String> = (0..SESSIONS).map(|i| format!("k{i}")).collect();
    expected.sort();
    assert_eq!(ended, expected, "each session ended once");
}

/// Every event in a replay from the start.
fn replay(daemon: &Daemon) -> Vec<Value> {
    let mut stream = daemon.connect();
    let ack = stream.request(json!({"op": "subscribe", "since": 0}));
    let head = ack["subscribed"]["head"].as_u64().expect("head");
    let mut events = Vec::new();
    let mut seen = 0;
    while seen < head {
        let line = stream
            .next_within(Duration::from_secs(5))
            .expect("the replay");
        seen = line["event"]["seq"].as_u64().unwrap_or(seen);
        events.push(line["event"].clone());
    }
    events
}

/// `end --terminate` of a session whose owner is a fork loop held at `tasks_max`: what
/// the cgroup holds after the grace is killed there at once (`cgroup.kill`; before 5.14
/// frozen, killed one by one, thawed), the cgroup empties and is removed, and the session
/// has one `session.reaped`.
#[test]
fn end_terminate_of_a_fork_loop_bounded_by_tasks_max_leaves_nothing_in_its_cgroup() {
    let Some(_) = usable_host("end_terminate_of_a_fork_loop") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let cgroup = status_cgroup(&daemon);
    let expected = if cgroup["kill"] == true {
        "kill"
    } else {
        "freeze"
    };
    assert_eq!(cgroup["termination"], expected, "{cgroup}");
    let mut owner = sleeper();
    let reply = daemon.request(json!({
        "op": "register", "session": "loop", "owner": {"pid": owner.id()},
        "grace_ms": 200, "cgroup": {"tasks_max": 16},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "loop");
    // The loop joins the cgroup, then forks until the limit refuses it (busybox's sh then
    // gives up; bash would go on): not a member of the owner's tree, so only the cgroup
    // knows of its children.
    let mut fork_loop = Command::new("sh")
        .args([
            "-c",
            "echo $$ > \"$1\"/cgroup.procs; while :; do sleep 600 & done 2>/dev/null",
            "sh",
        ])
        .arg(&path)
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || read(&path.join("pids.current"))
            .trim()
            .parse::<u32>()
            .unwrap()
            >= 15),
        "{}",
        read(&path.join("pids.current"))
    );
    let reply = daemon.request(json!({"op": "end", "session": "loop", "terminate": true}));
    assert_eq!(reply["ok"], true, "{reply}");
    let usage = wait_reclaimed(&daemon, "loop", &path);
    assert_eq!(usage["pids_peak"].as_u64().unwrap_or(16), 16, "{usage}");
    assert_eq!(owner.wait().unwrap().to_string(), "signal: 9 (SIGKILL)");
    let _ = fork_loop.wait();
    let reaped: Vec<Value> = replay(&daemon)
        .into_iter()
        .filter(|e| e["kind"] == "session.reaped" && e["session"] == "loop")
        .collect();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
}

/// The pids of the processes a session's tree lists (`processes`), sorted.
fn tree_pids(daemon: &Daemon, id: &str) -> Vec<u32> {
    let reply = daemon.request(json!({"op": "processes", "session": id, "limit": 10_000}));
    let mut pids: Vec<u32> = (reply["processes"].as_array())
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|p| p["identity"]["pid"].as_u64().unwrap() as u32)
        .collect();
    pids.sort_unstable();
    pids
}

/// The pids `cgroup.procs` lists, sorted.
fn procs(path: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = read(&path.join("cgroup.procs"))
        .lines()
        .map(|pid| pid.parse().unwrap())
        .collect();
    pids.sort_unstable();
    pids
}

/// The cgroup of `pid`, as `/proc/<pid>/cgroup` names it.
fn cgroup_line(pid: u32) -> String {
    read(Path::new(&format!("/proc/{pid}/cgroup")))
}

/// A tree built before its session was registered with a cgroup (a child, a grandchild, a
/// double-forked `setsid` orphan, a `CLONE_PARENT` child of a member) is moved into the
/// session's cgroup by the registration: the cgroup then holds what the session's tree
/// lists, in the kernel's and the scans' modes.
#[test]
fn a_tree_built_before_its_registration_is_moved_into_the_session_cgroup() {
    let Some(_) = usable_host("a_tree_built_before_its_registration") else {
        return;
    };
    let script = "sleep 600 & (setsid sleep 600 &); sh -c 'sleep 600 & wait' & \
                  echo go | \"$1\" sibling >/dev/null; echo ready; wait";
    for args in [&[][..], &["--sources", "pidfd"]] {
        let daemon = Daemon::start(args);
        let mut owner = Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(integration_tests::binary("testproc"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(owner.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        let reply = daemon.request(json!({
            "op": "register", "session": "built", "owner": {"pid": owner.id()},
            "grace_ms": 100, "cgroup": {},
        }));
        assert_eq!(reply["ok"], true, "{reply}");
        assert!(reply["warnings"].is_null(), "{reply}");
        let path = cgroup_of(&daemon, "built");
        // The reply came once they were moved.
        let (tree, inside) = (tree_pids(&daemon, "built"), procs(&path));
        // The owner, its sleep, the inner sh and its sleep, the CLONE_PARENT child.
        assert!(inside.len() >= 5, "{args:?}: {inside:?}");
        assert_eq!(tree, inside, "{args:?}: the tree and cgroup.procs");
        let reply = daemon.request(json!({"op": "end", "session": "built", "terminate": true}));
        assert_eq!(reply["ok"], true, "{reply}");
        wait_reclaimed(&daemon, "built", &path);
        let _ = owner.wait();
    }
}

/// A user's registration moves none of another's processes into her cgroup: not pid 1
/// (its owner is refused), not a member of her tree that runs as another user (as a
/// set-user-ID program she started would): it stays where it was, a member all the same.
#[test]
fn a_users_registration_moves_no_process_of_anothers_into_her_cgroup() {
    let Some(_) = usable_host("a_users_registration_moves_no_process") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    let init = cgroup_line(1);
    let reply = mallory
        .request(&json!({"op": "register", "session": "init", "owner": {"pid": 1}, "cgroup": {}}))
        .unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(cgroup_line(1), init);

    // Her owner, whose first child stays root's: forked before the owner becomes hers.
    let sleep = std::ffi::CString::new("sleep").unwrap();
    let long = std::ffi::CString::new("600").unwrap();
    let mut command = Command::new("sh");
    command
        .args(["-c", "sleep 600 & echo $!; wait"])
        .stdout(Stdio::piped());
    let uid = MALLORY;
    // SAFETY: between fork and exec, only fork, execvp and the id-changing syscalls.
    unsafe {
        command.pre_exec(move || {
            let argv = [sleep.as_ptr(), long.as_ptr(), std::ptr::null()];
            if libc::fork() == 0 {
                libc::execvp(argv[0], argv.as_ptr());
                libc::_exit(127);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(uid, uid, uid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut owner = command.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(owner.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let hers: u32 = line.trim().parse().unwrap();
    let roots: Vec<u32> = (read(Path::new(&format!(
        "/proc/{}/task/{0}/children",
        owner.id()
    ))))
    .split_whitespace()
    .map(|pid| pid.parse().unwrap())
    .filter(|&pid| pid != hers)
    .collect();
    let [root_child] = roots[..] else {
        panic!("{roots:?}")
    };
    let before = cgroup_line(root_child);
    let reply = mallory
        .request(&json!({"op": "register", "session": "mixed", "owner": {"pid": owner.id()}, "cgroup": {}}))
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    let path = PathBuf::from(reply["session"]["cgroup"]["path"].as_str().unwrap());
    let mut expected = vec![owner.id(), hers];
    expected.sort_unstable();
    assert_eq!(procs(&path), expected);
    assert_eq!(cgroup_line(root_child), before);
    let reply = daemon.request(json!({"op": "processes", "session": "mixed", "uid": MALLORY}));
    let listed: Vec<u64> = (reply["processes"].as_array().unwrap().iter())
        .map(|p| p["identity"]["pid"].as_u64().unwrap())
        .collect();
    assert!(listed.contains(&u64::from(root_child)), "{reply}");
    for pid in [owner.id(), hers, root_child] {
        sigkill(pid);
    }
    let _ = owner.wait();
}

/// A daemon SIGKILLed during the grace of a terminated session runs its reap again once
/// restarted, and that reap kills by the session's cgroup too: a process that joined the
/// cgroup without being a member of the tree is gone, the cgroup emptied and removed, and
/// the session has one `session.reaped`, resumed.
#[test]
fn a_reap_resumed_after_a_restart_kills_by_the_session_cgroup() {
    let Some(_) = usable_host("a_reap_resumed_after_a_restart") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start_with_state(Some(dir.path().join("state")), &[]);
    let mut owner = sleeper();
    let reply = daemon.request(json!({
        "op": "register", "session": "resumed", "owner": {"pid": owner.id()},
        "grace_ms": 3000, "cgroup": {},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "resumed");
    // Joins the cgroup by itself: only the cgroup knows of it.
    let mut stray = Command::new("sh")
        .args(["-c", "echo $$ > \"$1\"/cgroup.procs; exec sleep 600", "sh"])
        .arg(&path)
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || procs(&path)
            .contains(&stray.id())),
        "{:?}",
        procs(&path)
    );
    let reply = daemon.request(json!({"op": "end", "session": "resumed", "terminate": true}));
    assert_eq!(reply["ok"], true, "{reply}");
    daemon.kill9();
    assert!(
        stray.try_wait().unwrap().is_none(),
        "killed before the restart"
    );
    daemon.restart();
    wait_reclaimed(&daemon, "resumed", &path);
    assert_eq!(stray.wait().unwrap().to_string(), "signal: 9 (SIGKILL)");
    let _ = owner.wait();
    let reaped: Vec<Value> = replay(&daemon)
        .into_iter()
        .filter(|e| e["kind"] == "session.reaped" && e["session"] == "resumed")
        .collect();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    assert_eq!(reaped[0]["reaped"]["resumed"], true, "{reaped:?}");
}

/// With eBPF, a member root moves out of its session's cgroup while the owner lives is
/// announced at once: one `session.escaped` (pid, start time, `/elsewhere`), recorded once
/// in `cgroup.escaped` (not again when it moves again, nor when the end finds it among its
/// survivors), and it is still the session's (`whose`, the end's survivors). Moves into the
/// session's cgroup (the registration's) or a cgroup below it are no escape, and a storm of
/// moves of the escaped member holds up no other session's death.
#[test]
fn a_member_moved_out_of_its_session_cgroup_is_an_escape_and_still_a_survivor() {
    let Some(mount) = usable_host("a_member_moved_out_of_its_session_cgroup") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let mut events = integration_tests::subscribe(&daemon, None);
    let (mut owner, member) = owner_with_member();
    let reply = daemon.request(json!({
        "op": "register", "session": "esc", "owner": {"pid": owner.id()}, "cgroup": {},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "esc");
    assert!(procs(&path).contains(&member), "{:?}", procs(&path));
    let below = path.join("below");
    std::fs::create_dir(&below).unwrap();
    std::fs::write(below.join("cgroup.procs"), member.to_string()).unwrap();
    std::fs::write(path.join("cgroup.procs"), member.to_string()).unwrap();
    std::fs::remove_dir(&below).unwrap();
    let (elsewhere, further) = (mount.join("elsewhere"), mount.join("further"));
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir(&further).unwrap();
    std::fs::write(elsewhere.join("cgroup.procs"), member.to_string()).unwrap();
    let start_ticks = integration_tests::start_ticks(member).unwrap();
    let escape = json!({"pid": member, "start_ticks": start_ticks, "cgroup": "/elsewhere"});
    // The first escaped event is this one: the moves within its cgroup were none.
    let escaped = events.next_event_of("session.escaped", "esc", Duration::from_secs(5));
    assert_eq!(escaped["escape"], escape, "{escaped}");
    assert_eq!(daemon.session("esc")["cgroup"]["escaped"], json!([escape]));
    let whose = daemon.cli(&["whose", "--pid", &member.to_string(), "--json"]);
    let whose: Value = serde_json::from_slice(&whose.stdout).unwrap();
    assert_eq!(whose["id"], "esc", "{whose}");

    // A storm of moves of the escaped member (2,000, between two cgroups) while another
    // session's owner dies: that death is published within a second, no escape is added.
    let mut other = sleeper();
    integration_tests::register(&daemon, "other", other.id());
    let storm = std::thread::spawn(move || {
        for i in 0..2000 {
            let to = if i % 2 == 0 { &further } else { &elsewhere };
            std::fs::write(to.join("cgroup.procs"), member.to_string()).unwrap();
        }
    });
    let killed = std::time::Instant::now();
    other.kill().unwrap();
    other.wait().unwrap();
    events.next_event_of("session.ended", "other", Duration::from_secs(1));
    let latency = killed.elapsed();
    storm.join().unwrap();
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    std::fs::write(mount.join("elsewhere/cgroup.procs"), member.to_string()).unwrap();

    owner.kill().unwrap();
    owner.wait().unwrap();
    let ended = events.next_event_of("session.ended", "esc", Duration::from_secs(5));
    let survivors = &ended["survivors"]["members"];
    assert_eq!(survivors[0]["pid"], member, "{ended}");
    wait_reclaimed(&daemon, "esc", &path);
    let session = daemon.session("esc");
    assert_eq!(session["cgroup"]["escaped"], json!([escape]), "{session}");
    let stored: Vec<Value> = replay(&daemon)
        .into_iter()
        .filter(|e| e["kind"] == "session.escaped")
        .collect();
    assert_eq!(stored.len(), 1, "{stored:?}");
    let text = daemon.cli(&["get", "--session", "esc"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "Escaped: pid {member} left the session's cgroup for /elsewhere"
        )),
        "{text}"
    );
    sigkill(member);
    for dir in ["elsewhere", "further"] {
        let dir = mount.join(dir);
        assert!(eventually(Duration::from_secs(30), || std::fs::remove_dir(
            &dir
        )
        .is_ok()));
    }
}

/// Without eBPF (`--sources pidfd`) no move is seen as it happens: an escape is found at
/// the session's end among its survivors, and no `session.escaped` announces it.
#[test]
fn without_ebpf_an_escape_is_found_at_the_end() {
    let Some(mount) = usable_host("without_ebpf_an_escape_is_found_at_the_end") else {
        return;
    };
    let daemon = Daemon::start(&["--sources", "pidfd"]);
    let (mut owner, member) = owner_with_member();
    let reply = daemon.request(json!({
        "op": "register", "session": "late", "owner": {"pid": owner.id()}, "cgroup": {},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "late");
    let elsewhere = mount.join("elsewhere-late");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("cgroup.procs"), member.to_string()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(daemon.session("late")["cgroup"]["escaped"].is_null());
    owner.kill().unwrap();
    owner.wait().unwrap();
    daemon.wait_ended("late");
    wait_reclaimed(&daemon, "late", &path);
    let start_ticks = integration_tests::start_ticks(member).unwrap();
    let escape = json!({"pid": member, "start_ticks": start_ticks, "cgroup": "/elsewhere-late"});
    assert_eq!(daemon.session("late")["cgroup"]["escaped"], json!([escape]));
    assert!(
        replay(&daemon)
            .iter()
            .all(|e| e["kind"] != "session.escaped")
    );
    sigkill(member);
    assert!(eventually(Duration::from_secs(30), || std::fs::remove_dir(
        &elsewhere
    )
    .is_ok()));
}

/// `livenessd --session-cgroup LIMITS`: every new session asks for a cgroup with them
/// unless it asks for its own or refuses one (`--no-cgroup`), and `status` shows them. On
/// a host without usable cgroup2 each such registration succeeds without one, with the
/// warning; where it is usable (the VM guests) the default's limits are written.
#[test]
fn the_daemons_default_cgroup_is_every_sessions_unless_it_asks_otherwise() {
    let daemon = Daemon::start(&["--session-cgroup", "memory-max=64M,tasks-max=32"]);
    let cgroup = status_cgroup(&daemon);
    assert_eq!(
        cgroup["default"],
        json!({"memory_max": 64 << 20, "tasks_max": 32}),
        "{cgroup}"
    );
    let usable = cgroup["usable"] == true;
    // The guests (LIVENESS_REQUIRE_CGROUP2=1) take the usable branch, or fail here.
    let test = "the_daemons_default_cgroup_is_every_sessions_unless_it_asks_otherwise";
    assert_eq!(usable, usable_host(test).is_some(), "{cgroup}");
    let status = daemon.cli(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("every new session asks for one unless it refuses (--no-cgroup): memory-max=67108864,tasks-max=32"),
        "{text}"
    );

    let mut owner = sleeper();
    let pid = owner.id().to_string();
    let register = |id: &str, flags: &[&str]| {
        let mut args = vec!["register", "--session", id, "--owner-pid", pid.as_str()];
        args.extend(flags);
        let out = daemon.cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{id}: {stderr}");
        (daemon.session(id)["cgroup"].clone(), stderr)
    };
    let (by_default, stderr) = register("by-default", &[]);
    let (own, _) = register("own", &["--cgroup", "--tasks-max", "8"]);
    let (refused, refused_stderr) = register("refused", &["--no-cgroup"]);
    if usable {
        assert_eq!(by_default["memory_max"], 64 << 20, "{by_default}");
        assert_eq!(by_default["tasks_max"], 32, "{by_default}");
        let path = cgroup_of(&daemon, "by-default");
        assert_eq!(read(&path.join("memory.max")).trim(), "67108864");
        assert_eq!(read(&path.join("pids.max")).trim(), "32");
        // Its own limits replace the default's whole.
        assert_eq!(own["tasks_max"], 8, "{own}");
        assert!(own.get("memory_max").is_none(), "{own}");
    } else {
        assert_eq!(by_default, Value::Null);
        assert!(stderr.contains("the session has no cgroup"), "{stderr}");
        assert_eq!(own, Value::Null);
    }
    assert_eq!(refused, Value::Null);
    assert!(
        !refused_stderr.contains("cgroup"),
        "a refused cgroup warns of nothing: {refused_stderr}"
    );

    // Both at once is no choice: refused by the CLI and by the daemon, nothing registered.
    let both = daemon.cli(&[
        "register",
        "--session",
        "both",
        "--owner-pid",
        &pid,
        "--cgroup",
        "--no-cgroup",
    ]);
    assert_eq!(both.status.code(), Some(64), "{both:?}");
    let reply = daemon.request(json!({
        "op": "register", "session": "both", "owner": {"pid": owner.id()},
        "cgroup": {}, "no_cgroup": true,
    }));
    assert_eq!(reply["error"]["code"], "invalid_request", "{reply}");
    let missing = daemon.request(json!({"op": "get", "session": "both"}));
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");
    owner.kill().unwrap();
    owner.wait().unwrap();

    // A daemon given a default it cannot apply does not start.
    for bad in ["memory-max=1G; rm -rf /", "tasks-max=0", "swap-max=1G"] {
        let out = Command::new(integration_tests::binary("livenessd"))
            .args(["--session-cgroup", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--session-cgroup"), "{bad}: {stderr}");
    }
}

/// `until: "tree"` with a cgroup: the tree is over once none of its members lives *and*
/// the session's cgroup holds no process. A process that joined the cgroup by a write
/// (never forked in the tree) keeps the session ACTIVE after its owner and members die,
/// across a restart, while the owner's session that lasts until the owner ends at its
/// death; a member moved out of its cgroup keeps its session waiting through the tree.
/// Each ends `tree_exited` once the last of them is gone.
#[test]
fn until_tree_waits_for_the_session_cgroup_to_be_empty_and_for_escaped_members() {
    let Some(mount) = usable_host("until_tree_waits_for_the_session_cgroup") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start_with_state(Some(dir.path().join("state")), &[]);
    let register = |id: &str, owner: &Child, extra: Value| {
        let mut request = json!({"op": "register", "session": id, "owner": {"pid": owner.id()}});
        request
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let reply = daemon.request(request);
        assert_eq!(reply["ok"], true, "{reply}");
    };
    // The cgroup's truth: a joiner outlives the tree.
    let (mut owner, member) = owner_with_member();
    register("joined", &owner, json!({"until": "tree", "cgroup": {}}));
    register("owner-only", &owner, json!({}));
    let path = cgroup_of(&daemon, "joined");
    let mut joiner = sleeper();
    std::fs::write(path.join("cgroup.procs"), joiner.id().to_string()).unwrap();
    // The tree's truth: an escape outlives the cgroup.
    let (mut other, escaped) = owner_with_member();
    register("escaped", &other, json!({"until": "tree", "cgroup": {}}));
    let elsewhere = mount.join("elsewhere-until-tree");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("cgroup.procs"), escaped.to_string()).unwrap();

    for child in [&mut owner, &mut other] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    sigkill(member);
    daemon.wait_ended("owner-only");
    daemon.still_active("joined", "while a process is in its cgroup");
    daemon.still_active("escaped", "while an escaped member lives");
    daemon.stop();
    daemon.restart();
    daemon.still_active("joined", "after a restart");

    joiner.kill().unwrap();
    joiner.wait().unwrap();
    let ended = daemon.wait_ended("joined");
    assert_eq!(ended["reason"], "tree_exited", "{ended}");
    sigkill(escaped);
    let ended = daemon.wait_ended("escaped");
    assert_eq!(ended["reason"], "tree_exited", "{ended}");
    assert!(eventually(Duration::from_secs(30), || std::fs::remove_dir(
        &elsewhere
    )
    .is_ok()));
}

/// What a session's cgroup counted, as stored, is what its files said just before its
/// last process died: CPU time and peak memory within 5 % (its exit may add a little),
/// the peak of processes and the OOM kills the same.
#[test]
fn a_sessions_stored_counters_are_its_cgroup_files_within_5_percent() {
    let Some(_) = usable_host("a_sessions_stored_counters_are_its_cgroup_files") else {
        return;
    };
    let daemon = Daemon::start(&[]);
    // Busy in its cgroup once told to, then asleep.
    let mut owner = Command::new("sh")
        .args([
            "-c",
            "read go; i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done; echo busy; exec sleep 600",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let reply = daemon.request(json!({
        "op": "register", "session": "counted", "owner": {"pid": owner.id()}, "cgroup": {},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let path = cgroup_of(&daemon, "counted");
    std::io::Write::write_all(owner.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let mut line = String::new();
    BufReader::new(owner.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "busy\n");
    let comm = format!("/proc/{}/comm", owner.id());
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(&comm).is_ok_and(|c| c == "sleep\n")
    }));
    let number = |file: &str, key: Option<&str>| -> Option<u64> {
        let text = std::fs::read_to_string(path.join(file)).ok()?;
        match key {
            Some(key) => text
                .lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok()),
            None => text.trim().parse().ok(),
        }
    };
    let cpu = number("cpu.stat", Some("usage_usec ")).expect("cpu.stat");
    let memory_peak = number("memory.peak", None);
    let pids_peak = number("pids.peak", None);
    let oom_kill = number("memory.events", Some("oom_kill "));
    owner.kill().unwrap();
    owner.wait().unwrap();
    daemon.wait_ended("counted");
    let usage = wait_reclaimed(&daemon, "counted", &path);
    let stored = usage["cpu_usec"].as_u64().expect("cpu_usec");
    assert!(
        cpu > 0 && stored >= cpu && stored <= cpu + cpu / 20,
        "read {cpu} µs, stored {usage}"
    );
    let within = |read: Option<u64>, stored: Option<u64>| match (read, stored) {
        (Some(read), Some(stored)) => stored >= read && stored <= read + read / 20,
        (read, stored) => read == stored,
    };
    assert!(
        within(memory_peak, usage["memory_peak"].as_u64()),
        "read {memory_peak:?}, stored {usage}"
    );
    assert_eq!(usage["pids_peak"].as_u64(), pids_peak, "{usage}");
    assert_eq!(
        usage["memory_events"]["oom_kill"].as_u64(),
        oom_kill,
        "{usage}"
    );
}
