//! The `liveness` command line's conventions, on the real binaries: global `--json` and
//! `--socket`, JSON errors, one exit code per meaning, suggestions, quiet EPIPE,
//! `watch --exec` checks, and the agent-hooks example run verbatim.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use integration_tests::{Daemon, Orphan, binary, copy_executable, eventually};
use serde_json::Value;

fn liveness(args: &[&str]) -> Output {
    Command::new(binary("liveness"))
        .args(args)
        .output()
        .expect("run liveness")
}

fn stderr_json(output: &Output) -> Value {
    serde_json::from_slice(&output.stderr)
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {output:?}"))
}

fn register_self(daemon: &Daemon, session: &str, labels: &[&str]) {
    let pid = std::process::id().to_string();
    let mut args = vec!["register", "--session", session, "--owner-pid", &pid];
    for label in labels {
        args.extend(["--label", label]);
    }
    let output = daemon.cli(&args);
    assert!(output.status.success(), "register {session}: {output:?}");
}

#[test]
fn json_and_socket_are_taken_before_or_after_the_subcommand() {
    let daemon = Daemon::start(&[]);
    let socket = daemon.socket.to_str().unwrap();
    for args in [
        &["--json", "--socket", socket, "status"][..],
        &["status", "--json", "--socket", socket][..],
        &["--socket", socket, "status", "--json"][..],
    ] {
        let output = liveness(args);
        assert!(output.status.success(), "{args:?}: {output:?}");
        let status: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {output:?}"));
        assert!(status["daemon"]["pid"].is_u64(), "{args:?}: {status}");
    }
}

#[test]
fn with_json_failures_are_json_objects_with_one_code_per_meaning() {
    let daemon = Daemon::start(&[]);
    let missing = daemon.cli(&["--json", "get", "--session", "no-such-session"]);
    assert_eq!(missing.status.code(), Some(66), "{missing:?}");
    let error = stderr_json(&missing);
    assert_eq!(error["error"]["code"], "not_found", "{error}");
    assert_eq!(error["error"]["exit"], 66, "{error}");
    assert_eq!(error["error"]["daemon_code"], "not_found", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-session")),
        "{error}"
    );

    let unreachable = liveness(&["--socket", "/nonexistent/liveness.sock", "--json", "list"]);
    assert_eq!(unreachable.status.code(), Some(69), "{unreachable:?}");
    assert_eq!(stderr_json(&unreachable)["error"]["code"], "unavailable");

    let usage = liveness(&["--json", "get"]);
    assert_eq!(usage.status.code(), Some(64), "{usage:?}");
    let error = stderr_json(&usage);
    assert_eq!(error["error"]["code"], "usage", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--session")),
        "names the missing option: {error}"
    );

    // Without --json the same failure is one line of text.
    let text = daemon.cli(&["get", "--session", "no-such-session"]);
    assert_eq!(text.status.code(), Some(66));
    assert!(
        String::from_utf8_lossy(&text.stderr).starts_with("liveness: "),
        "{text:?}"
    );
}

#[test]
fn no_such_process_exits_66_from_register_and_whose_alike() {
    let daemon = Daemon::start(&[]);
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let gone = child.id().to_string();
    let register = daemon.cli(&["register", "--session", "s", "--owner-pid", &gone]);
    assert_eq!(register.status.code(), Some(66), "register: {register:?}");
    let whose = daemon.cli(&["whose", "--pid", &gone]);
    assert_eq!(whose.status.code(), Some(66), "whose: {whose:?}");
    let resolve = liveness(&["resolve-owner", "--pid", &gone]);
    assert_eq!(
        resolve.status.code(),
        Some(66),
        "resolve-owner: {resolve:?}"
    );
}

#[test]
fn owner_given_a_pid_points_at_owner_pid() {
    let output = liveness(&["register", "--session", "s", "--owner", "1234"]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--owner-pid 1234"), "{stderr}");
    assert!(!stderr.contains("possible values"), "{stderr}");
}

#[test]
fn a_closed_stdout_ends_list_quietly() {
    let daemon = Daemon::start(&[]);
    for i in 0..3 {
        register_self(&daemon, &format!("s{i}"), &[]);
    }
    for json in [false, true] {
        // The reader is gone before the first line is written: every write is EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut command = Command::new(binary("liveness"));
        command.arg("--socket").arg(&daemon.socket).arg("list");
        if json {
            command.arg("--json");
        }
        let output = command
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "json {json}: {output:?}");
        assert!(
            output.stderr.is_empty(),
            "json {json}: nothing on stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn list_filters_by_label() {
    let daemon = Daemon::start(&[]);
    register_self(&daemon, "a", &["tool=agent", "repo=x"]);
    register_self(&daemon, "b", &["tool=agent", "repo=y"]);
    register_self(&daemon, "c", &["tool=build"]);
    let ids = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["--json", "list"];
        all.extend(args);
        let output = daemon.cli(&all);
        assert!(output.status.success(), "{args:?}: {output:?}");
        let sessions: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
        let mut ids: Vec<String> = sessions
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&[]), ["a", "b", "c"]);
    assert_eq!(ids(&["--label", "tool=agent"]), ["a", "b"]);
    assert_eq!(ids(&["--label", "tool=agent", "--label", "repo=y"]), ["b"]);
    assert!(ids(&["--label", "tool=none"]).is_empty());
    let bad = daemon.cli(&["list", "--label", "novalue"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
}

#[test]
fn watch_filters_by_label() {
    let daemon = Daemon::start(&[]);
    let mut watcher = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--json", "--since", "0", "--label", "tool=agent"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    register_self(&daemon, "other", &["tool=build"]);
    register_self(&daemon, "mine", &["tool=agent"]);
    let stdout = watcher.stdout.take().unwrap();
    let first = std::thread::spawn(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        line
    });
    let arrived = eventually(Duration::from_secs(15), || first.is_finished());
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(arrived, "no event reached the watcher");
    let line: Value = serde_json::from_str(&first.join().unwrap()).unwrap();
    assert_eq!(
        line["event"]["session"], "mine",
        "the first event shown is the labelled one: {line}"
    );
}

#[test]
fn watch_exec_refuses_a_missing_script_at_start() {
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sh");
    let output = daemon.cli(&["watch", "--exec", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("missing.sh"),
        "{output:?}"
    );
}

/// The cursor's directory does not exist yet; the watcher creates it at start, before the
/// first event, so handling that event does not fail on writing the cursor.
#[test]
fn watch_creates_the_cursor_directory_at_start() {
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cursor = dir.path().join("not/yet/there/cursor");
    let mut watcher = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--exec", "true", "--cursor"])
        .arg(&cursor)
        .spawn()
        .unwrap();
    let created = eventually(Duration::from_secs(15), || {
        cursor.parent().unwrap().is_dir()
    });
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        created,
        "{} was not created",
        cursor.parent().unwrap().display()
    );
}

/// `examples/agent-hooks`: its hooks verbatim, with HOME a fresh directory and the binaries
/// on PATH. Each agent leaves an orphaned server behind, which `whose` and `processes`
/// still place in its session and which the session's end terminates; the session's end
/// action, run by the daemon, releases its lock file.
#[test]
fn agent_hooks_example_works_verbatim() {
    const README: &str = include_str!("../../examples/agent-hooks/README.md");
    const SCRIPTS: [(&str, &str); 4] = [
        (
            "session-start.sh",
            include_str!("../../examples/agent-hooks/session-start.sh"),
        ),
        (
            "session-end.sh",
            include_str!("../../examples/agent-hooks/session-end.sh"),
        ),
        (
            "on-ended.sh",
            include_str!("../../examples/agent-hooks/on-ended.sh"),
        ),
        (
            "session-id.sh",
            include_str!("../../examples/agent-hooks/session-id.sh"),
        ),
    ];
    let wait_command = README
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("liveness wait --session"))
        .expect("the README shows how to wait for the end action");

    let daemon = Daemon::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let hooks = work.path().join("agent-hooks");
    std::fs::create_dir(&hooks).unwrap();
    for (name, body) in SCRIPTS {
        let path = hooks.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let home = work.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let locks = work.path().join("locks");
    let bin_dir = binary("liveness").parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // `PROGRAM -c SCRIPT` in the hooks' directory, as the user of the README would run it.
    let run = |program: &Path, script: &str| {
        let mut command = Command::new(program);
        command
            .arg("-c")
            .arg(script)
            .current_dir(&hooks)
            .env("HOME", &home)
            .env("PATH", &path)
            .env("LIVENESS_SOCKET", &daemon.socket)
            .env("AGENT_LOCK_DIR", &locks);
        command
    };

    // Two sessions, each owned by an "agent": a copy of bash under another name (the owner
    // walk skips programs by their executable's name), as a real agent would be.
    // Each agent starts an "MCP server" after its session began, the way `npx` does: in the
    // background of a shell that exits at once, so that the server is an orphan of init.
    let agent = work.path().join("agent");
    copy_executable(Path::new("/bin/bash"), &agent);
    let mut agents = Vec::new();
    for id in ["agent-1", "agent-2"] {
        let script = format!(
            "SESSION_ID={id} ./session-start.sh </dev/null; \
             sh -c 'sleep 601 </dev/null >/dev/null 2>&1 & echo $! >{id}.server.tmp'; \
             mv {id}.server.tmp {id}.server; exec sleep 600"
        );
        let agent = run(&agent, &script).stderr(Stdio::null()).spawn().unwrap();
        agents.push(agent);
    }
    let lock = |id: &str| locks.join(format!("{id}.lock"));
    let server_file = |id: &str| hooks.join(format!("{id}.server"));
    assert!(
        eventually(Duration::from_secs(15), || ["agent-1", "agent-2"]
            .iter()
            .all(|id| lock(id).exists() && server_file(id).exists())),
        "the start hook made no locks, or no server started\n{}",
        daemon.log()
    );
    let mut servers = Vec::new();
    for id in ["agent-1", "agent-2"] {
        let pid: u32 = std::fs::read_to_string(server_file(id))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let server = integration_tests::Fingerprint::of(pid);
        // Its parent is gone; the session it belongs to is still known, from the CLI.
        let whose = daemon.cli(&["whose", "--pid", &pid.to_string(), "--json"]);
        let whose: Value = serde_json::from_slice(&whose.stdout)
            .unwrap_or_else(|e| panic!("whose --pid {pid}: {e}: {whose:?}"));
        assert_eq!(whose["id"], id, "whose --pid {pid}: {whose}");
        let listed = daemon.cli(&["processes", "--session", id, "--json"]);
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains(&format!("\"pid\":{pid}")),
            "processes --session {id} does not list the server {pid}: {listed:?}"
        );
        servers.push(server);
    }
    for agent in &mut agents {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    // `--on-end terminate`: the servers go with their agents' sessions, not days later.
    for server in &servers {
        let gone = eventually(Duration::from_secs(15), || !server.is_running());
        server.kill();
        assert!(
            gone,
            "the orphaned server {} outlived its session\n{}",
            server.pid,
            daemon.log()
        );
    }
    // The README's wait, for each session: it returns once the end action has run.
    for id in ["agent-1", "agent-2"] {
        let waited = run(Path::new("/bin/sh"), wait_command)
            .env("SESSION_ID", id)
            .output()
            .unwrap();
        // Its exit code says how the agent ended (killed here), as `wait`'s always does.
        let said = String::from_utf8_lossy(&waited.stdout);
        assert!(said.contains("Finalized:"), "{waited:?}\n{}", daemon.log());
        assert!(
            !lock(id).exists(),
            "on-ended.sh did not release {id}'s lock"
        );
        let session = daemon.cli(&["get", "--session", id, "--json"]);
        let session: Value = serde_json::from_slice(&session.stdout).unwrap();
        let outcome = &session["actions"][0]["outcome"];
        assert_eq!(outcome["exit"]["code"], 0, "{session}");
        let said = outcome["stderr_tail"].as_str().unwrap_or_default();
        assert!(said.contains("released"), "{session}");
    }
}

/// A socket directory that does not exist is refused (it is not the default runtime
/// directory), and nothing is created.
#[test]
fn livenessd_refuses_a_socket_directory_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent/dir");
    let output = Command::new(binary("livenessd"))
        .arg("--socket")
        .arg(missing.join("x.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("does not exist") && stderr.contains(&missing.display().to_string()),
        "{stderr}"
    );
    assert!(
        !dir.path().join("nonexistent").exists(),
        "the directory was created"
    );
}

/// `--owner auto` under `timeout` stops at `timeout`: the registration succeeds with a
/// warning that names `--wrapper`; `--wrapper timeout` on the request skips it, for that
/// request only.
#[test]
fn an_auto_owner_that_is_a_launcher_is_warned_of_and_wrappers_are_per_request() {
    let daemon = Daemon::start(&[]);
    // A `timeout` that stays the parent of what it runs, as GNU timeout does (busybox's
    // execs the command in its own process): a copy of bash under that name, which runs
    // its script in a child.
    let dir = tempfile::tempdir().unwrap();
    let timeout = dir.path().join("timeout");
    copy_executable(Path::new("/bin/bash"), &timeout);
    let register = |session: &str, extra: &str| {
        let script = format!(
            "{} --socket {} register --session {session} --owner auto {extra}; true",
            binary("liveness").display(),
            daemon.socket.display()
        );
        Command::new(&timeout)
            .args(["-c", &script])
            .output()
            .expect("run timeout")
    };
    let warned = register("under-timeout", "");
    assert!(warned.status.success(), "{warned:?}");
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("--wrapper timeout"),
        "{stderr}"
    );
    assert_eq!(
        daemon.session("under-timeout")["owner"]["comm"],
        "timeout",
        "without the wrapper, the owner is timeout"
    );

    let skipped = register("past-timeout", "--wrapper timeout --json");
    assert!(skipped.status.success(), "{skipped:?}");
    assert!(skipped.stderr.is_empty(), "no warning: {skipped:?}");
    assert_eq!(
        daemon.session("past-timeout")["owner"]["pid"],
        std::process::id(),
        "timeout skipped: the owner is this test"
    );

    // The wrapper was for that request only.
    let again = register("under-timeout-again", "--json");
    let warning: Value = serde_json::from_slice(&again.stderr)
        .unwrap_or_else(|e| panic!("a JSON warning ({e}): {again:?}"));
    assert!(
        warning["warning"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("launcher")),
        "{warning}"
    );
}

/// Completions for three shells and a man page per subcommand, nested ones (`lock acquire`)
/// too, from the clap definitions.
#[test]
fn completions_and_man_pages_are_generated_for_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let output = liveness(&["completions", shell]);
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8_lossy(&output.stdout);
        assert!(
            script.contains("register") && script.contains("--owner-pid"),
            "{shell}: the script knows the subcommands and their flags"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let output = liveness(&["generate-man", dir.path().to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    // The subcommands `liveness PATH --help` lists, as pages `liveness-PATH-NAME`.
    let subcommands = |path: &[&str]| -> Vec<String> {
        let help = liveness(&[path, &["--help"]].concat());
        let prefix = [&["liveness"], path].concat().join("-");
        String::from_utf8_lossy(&help.stdout)
            .lines()
            .skip_while(|line| !line.starts_with("Commands:"))
            .skip(1)
            .take_while(|line| line.starts_with("  "))
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(|name| format!("{prefix}-{name}"))
            .collect()
    };
    let mut pages = subcommands(&[]);
    assert!(pages.contains(&"liveness-register".to_owned()), "{pages:?}");
    let lock = subcommands(&["lock"]);
    assert!(
        lock.contains(&"liveness-lock-acquire".to_owned()),
        "{lock:?}"
    );
    pages.extend(lock);
    for name in pages {
        let page = dir.path().join(format!("{name}.1"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(text.contains(".TH"), "{} is a man page", page.display());
    }
    let output = Command::new(binary("livenessd"))
        .arg("--generate-man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(dir.path().join("livenessd.8").exists());
}

/// A refusal names the cleanup policy with the words the user types (`leave`), not the
/// program's own (`Leave`).
#[test]
fn a_changed_cleanup_policy_is_refused_in_the_users_words() {
    let daemon = Daemon::start(&[]);
    register_self(&daemon, "kept", &[]);
    let pid = std::process::id().to_string();
    let changed = daemon.cli(&[
        "register",
        "--session",
        "kept",
        "--owner-pid",
        &pid,
        "--on-end",
        "terminate",
    ]);
    assert_eq!(changed.status.code(), Some(65), "{changed:?}");
    let stderr = String::from_utf8_lossy(&changed.stderr);
    assert!(
        stderr.contains("on_end leave") && !stderr.contains("Leave"),
        "{stderr}"
    );
}

/// `get --json` and `whose --json` print a session in one shape: its fields at the top,
/// so that `jq .survivors` reads either; `whose` adds the owner's pid as the caller
/// numbers it.
#[test]
fn get_and_whose_print_a_session_in_one_shape() {
    let daemon = Daemon::start(&[]);
    register_self(&daemon, "shape", &["k=v"]);
    let me = std::process::id();
    let get: Value =
        serde_json::from_slice(&daemon.cli(&["--json", "get", "--session", "shape"]).stdout)
            .expect("get --json");
    let whose: Value = serde_json::from_slice(
        &daemon
            .cli(&["--json", "whose", "--pid", &me.to_string()])
            .stdout,
    )
    .expect("whose --json");
    assert_eq!(get["id"], "shape", "{get}");
    assert_eq!(whose["owner_pid"], me, "{whose}");
    let mut session = whose.clone();
    session.as_object_mut().unwrap().remove("owner_pid");
    assert_eq!(session, get, "whose --json is get --json and owner_pid");
    // What the docs show: `get --json | jq .survivors` once the session has ended.
    assert!(daemon.cli(&["end", "--session", "shape"]).status.success());
    let ended: Value =
        serde_json::from_slice(&daemon.cli(&["--json", "get", "--session", "shape"]).stdout)
            .expect("get --json");
    assert!(ended["survivors"]["total"].is_u64(), "{ended}");
}

/// `liveness watch | head -1`: once the reader has gone, the watcher ends (quietly, 0)
/// without waiting for another event to fail writing.
#[test]
fn watch_ends_when_its_reader_goes_without_waiting_for_an_event() {
    let daemon = Daemon::start(&[]);
    register_self(&daemon, "a", &[]);
    register_self(&daemon, "b", &[]);
    for json in [false, true] {
        let mut command = Command::new(binary("liveness"));
        command
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["watch", "--since", "0"]);
        if json {
            command.arg("--json");
        }
        let mut watcher = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let mut reader = std::io::BufReader::new(watcher.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut reader, &mut first).unwrap();
        assert!(first.contains('a'), "json {json}: {first}");
        drop(reader);
        // No event follows: only the closed pipe can end it.
        let ended = eventually(Duration::from_secs(10), || {
            matches!(watcher.try_wait(), Ok(Some(_)))
        });
        if !ended {
            let _ = watcher.kill();
        }
        let output = watcher.wait_with_output().unwrap();
        assert!(ended, "json {json}: still running after its reader left");
        assert_eq!(output.status.code(), Some(0), "json {json}: {output:?}");
        assert!(output.stderr.is_empty(), "json {json}: {output:?}");
    }
}

/// The README stays an introduction (at most 250 lines; the details live in docs/), and
/// keeps the two commands a new machine starts with: the daemon on its embedded defaults,
/// and the test command CI runs.
#[test]
fn the_readme_stays_short_and_keeps_its_two_commands() {
    const README: &str = include_str!("../../README.md");
    let lines = README.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move details to docs/"
    );
    for command in [
        "cargo build --release -p liveness-daemon -p liveness-cli && ./target/release/livenessd\n",
        "\ncargo test --workspace ",
    ] {
        assert!(README.contains(command), "README.md lacks {command:?}");
    }
}

/// docs/end-actions.md's hook commands are what `hooks install claude-code` writes, with the
/// path of the binary that ran it where the docs show the package's `/usr/bin/liveness`.
#[test]
fn the_documented_claude_code_hooks_are_those_installed() {
    const DOC: &str = include_str!("../../docs/end-actions.md");
    let work = tempfile::tempdir().unwrap();
    let settings = work.path().join("settings.json");
    let installed = liveness(&[
        "hooks",
        "install",
        "claude-code",
        "--settings",
        settings.to_str().unwrap(),
    ]);
    assert!(installed.status.success(), "{installed:?}");
    let written: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    let program = binary("liveness").display().to_string();
    for (event, hook) in [
        ("SessionStart", "session-start"),
        ("SessionEnd", "session-end"),
    ] {
        let command = written["hooks"][event][0]["hooks"][0]["command"]
            .as_str()
            .unwrap_or_else(|| panic!("no {event} hook: {written}"));
        assert_eq!(command, format!("{program} hooks claude-code {hook}"));
        let documented = format!(
            "\"{event}\": [{{\"hooks\": [{{\"type\": \"command\", \"command\": \"{}\"}}]}}]",
            command.replacen(&program, "/usr/bin/liveness", 1)
        );
        // The docs align the two lines with spaces.
        let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            DOC.lines().any(|line| words(line).starts_with(&documented)),
            "docs/end-actions.md lacks {documented}"
        );
    }
}

/// The README's commands on a daemon started as the README starts it log no warning that
/// asks nothing of the user: not the lineage pins it was never asked for, and not the
/// short life of `run` and `lock run` commands, which `liveness` itself started and waited
/// for. An owner that dies young and that its registering process did not start (a hook
/// that named the wrong process) is still warned of, once.
#[test]
fn the_readme_commands_log_no_warning_that_asks_nothing() {
    let daemon = Daemon::start(&[]);
    for args in [
        &["status"][..],
        &["run", "--label", "tool=ci", "--", "true"],
        &["run", "--", "sh", "-c", "exit 3"],
        &["lock", "run", "deploy", "--wait", "--", "true"],
    ] {
        let output = daemon.cli(args);
        assert!(
            output
                .status
                .code()
                .is_some_and(|code| code == 0 || code == 3),
            "{args:?}: {output:?}"
        );
    }
    let mut owner = Orphan::spawn(&["exit", "0"]);
    let pid = owner.pid.to_string();
    let registered = daemon.cli(&["register", "--session", "wrong", "--owner-pid", &pid]);
    assert!(registered.status.success(), "{registered:?}");
    owner.release();
    let young = "the owner exited within a second of its registration";
    assert!(
        eventually(Duration::from_secs(10), || daemon.log().contains(young)),
        "{}",
        daemon.log()
    );
    let log = daemon.log();
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("session=wrong"), "{warnings:#?}");
}
