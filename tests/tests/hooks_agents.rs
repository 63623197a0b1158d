//! The adapters of Codex, Gemini CLI, Copilot CLI, Cursor, Kiro and opencode end to end.
//!
//! - Golden files (`tests/agents/golden/AGENT/`): the user's file as they wrote it
//!   (`before.json`, where the agent has one) and what `install` makes of it
//!   (`installed.*`, with `@HOME@` and `@LIVENESS@` for the paths of the run); installing
//!   again changes no byte, and `uninstall` gives the user's file back byte for byte.
//! - A file that is not in the agent's format, and for Cursor one naming an event Cursor
//!   does not know, is refused and left as it is.
//! - A stand-in for each agent, run as a second user under the real agent's name
//!   (`tests/agents/standin.py`, `opencode-standin.js`), reads the installed files and runs
//!   the hooks with `sh -c` and the agent's documented payloads: SIGKILLed, the user's end
//!   command runs once, as the user, with the agent's payload and `liveness.exit.signal` 9;
//!   exiting after its own end hooks, nothing is run again; firing them twice, nothing is
//!   run by livenessd either.
//! - A link planted where an agent's file or its directory is refused, and what it points
//!   to is untouched.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::Duration;

use integration_tests::{BinariesForAnyUser, Daemon, privileged, shared_daemon_with};
use serde_json::Value;

/// The user the agents run as.
const ALICE: u32 = 61_053;

/// One agent as the tests drive it.
struct Case {
    agent: &'static str,
    /// The name the real agent's binary has, under which its stand-in runs.
    binary: &'static str,
    /// The file `install` writes, from HOME.
    file: &'static str,
    /// The user's own file of the agent's (with their end command), from HOME, when the
    /// golden files have one.
    user: Option<&'static str>,
    /// The hook input's session id field.
    session_key: &'static str,
    /// The options `install`, `uninstall` and `status` are given after the agent's name.
    args: &'static [&'static str],
    /// The directory of its golden files (`tests/agents/golden/GOLDEN/`).
    golden: &'static str,
}

/// Claude Code, for its activity hooks (its sessions are `hooks_claude_code.rs`'s).
const CLAUDE_CODE: Case = Case {
    agent: "claude-code",
    binary: "claude",
    file: ".claude/settings.json",
    user: None,
    session_key: "session_id",
    args: &[],
    golden: "claude-code",
};
const CODEX: Case = Case {
    agent: "codex",
    binary: "codex",
    file: ".codex/hooks.json",
    user: Some(".codex/hooks.json"),
    session_key: "session_id",
    args: &[],
    golden: "codex",
};
const GEMINI: Case = Case {
    agent: "gemini",
    binary: "gemini",
    file: ".gemini/settings.json",
    user: Some(".gemini/settings.json"),
    session_key: "session_id",
    args: &[],
    golden: "gemini",
};
const COPILOT: Case = Case {
    agent: "copilot",
    binary: "copilot",
    file: ".copilot/hooks/liveness.json",
    user: Some(".copilot/hooks/notify.json"),
    session_key: "sessionId",
    args: &[],
    golden: "copilot",
};
const CURSOR: Case = Case {
    agent: "cursor",
    binary: "cursor-agent",
    file: ".cursor/hooks.json",
    user: Some(".cursor/hooks.json"),
    session_key: "session_id",
    args: &[],
    golden: "cursor",
};
const KIRO: Case = Case {
    agent: "kiro",
    binary: "kiro-cli",
    file: ".kiro/hooks/liveness.json",
    user: None,
    session_key: "session_id",
    args: &[],
    golden: "kiro",
};
/// Kiro CLI 2.x, the hooks of its agent `dev` (`kiro-cli chat --agent dev`).
const KIRO_AGENT: Case = Case {
    agent: "kiro",
    binary: "kiro-cli",
    file: ".kiro/agents/dev.json",
    user: Some(".kiro/agents/dev.json"),
    session_key: "session_id",
    args: &["--agent", "dev"],
    golden: "kiro-agent",
};
const OPENCODE: Case = Case {
    agent: "opencode",
    binary: "opencode",
    file: ".config/opencode/plugin/liveness.js",
    user: None,
    session_key: "sessionID",
    args: &[],
    golden: "opencode",
};

fn golden(case: &Case, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("agents/golden")
        .join(case.golden)
        .join(name)
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A home of ALICE's, in a directory anyone may traverse, with the user's own file of the
/// agent's when the golden files have one.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new(case: &Case) -> Home {
        let home = Home {
            dir: tempfile::tempdir().unwrap(),
        };
        set_mode(home.dir.path(), 0o755);
        std::fs::create_dir(home.path()).unwrap();
        std::fs::create_dir(home.project()).unwrap();
        if let Some(user) = case.user {
            let text = std::fs::read_to_string(golden(case, "before.json")).unwrap();
            let file = home.path().join(user);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, home.fill(&text)).unwrap();
        }
        if case.agent == "codex" {
            // The user trusted their own hooks in Codex: config.toml records it.
            let out = Command::new("/usr/bin/python3")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/standin.py"))
                .arg("--trust")
                .arg(home.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        home.give_to_alice(&home.path());
        home
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("alice")
    }

    fn project(&self) -> PathBuf {
        self.dir.path().join("alice/project")
    }

    fn file(&self, case: &Case) -> PathBuf {
        self.path().join(case.file)
    }

    fn fill(&self, text: &str) -> String {
        text.replace("@HOME@", self.path().to_str().unwrap())
    }

    fn give_to_alice(&self, path: &Path) {
        let mut left = vec![path.to_owned()];
        while let Some(path) = left.pop() {
            std::os::unix::fs::lchown(&path, Some(ALICE), Some(ALICE)).unwrap();
            if path.is_dir() && !path.is_symlink() {
                left.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
        }
    }

    /// `liveness [--socket S] hooks VERB AGENT` run as ALICE with her HOME.
    fn hooks(&self, liveness: &Path, socket: Option<&Path>, verb: &str, case: &Case) -> Output {
        let mut command = Command::new(liveness);
        if let Some(socket) = socket {
            command.arg("--socket").arg(socket);
        }
        command
            .args(["hooks", verb, case.agent])
            .args(case.args)
            .env("HOME", self.path())
            .env_remove("CODEX_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("XDG_CONFIG_HOME")
            .uid(ALICE)
            .gid(ALICE)
            .output()
            .unwrap()
    }

    /// What the user's end command got: one hook input per run, and the uid of each run.
    fn runs(&self) -> (Vec<Value>, Vec<u32>) {
        let read = |name: &str| std::fs::read_to_string(self.path().join(name)).unwrap_or_default();
        let inputs = read("end.log")
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_str(line).expect("the hook input is JSON"))
            .collect();
        let uids = read("end.uid")
            .lines()
            .map(|uid| uid.parse().unwrap())
            .collect();
        (inputs, uids)
    }
}

/// The text of `path`, with the run's paths as the golden files write them.
fn normalized(home: &Home, liveness: &Path, path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
        .replace(liveness.to_str().unwrap(), "@LIVENESS@")
        .replace(home.path().to_str().unwrap(), "@HOME@")
}

fn install_matches_its_golden_file_and_uninstall_restores(case: &Case, installed: &str) {
    let home = Home::new(case);
    let binaries = BinariesForAnyUser::new();
    let liveness = binaries.path("liveness");
    let user_file = case.user.map(|user| home.path().join(user));
    let before = user_file.as_ref().map(|file| std::fs::read(file).unwrap());
    // Codex runs only the hooks its config.toml trusts: install records liveness's there.
    let config = home.path().join(".codex/config.toml");
    let config_before = std::fs::read_to_string(&config).ok();

    let out = home.hooks(&liveness, None, "install", case);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    if let Some(config_before) = &config_before {
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.starts_with(config_before.as_str()), "{text}");
        assert_eq!(
            text.matches("trusted_hash").count(),
            config_before.matches("trusted_hash").count() + 6,
            "one per hook of liveness's: {text}"
        );
    }
    let file = home.file(case);
    let actual = normalized(&home, &liveness, &file);
    // LIVENESS_BLESS=1 writes the golden files anew, for review.
    if std::env::var_os("LIVENESS_BLESS").is_some() {
        std::fs::write(golden(case, installed), &actual).unwrap();
    }
    let expected = std::fs::read_to_string(golden(case, installed)).unwrap();
    assert_eq!(actual, expected, "{file:?} as installed");
    let once = std::fs::read(&file).unwrap();

    let out = home.hooks(&liveness, None, "install", case);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        once,
        "installing again changes no byte"
    );
    if config_before.is_some() {
        let text = std::fs::read_to_string(&config).unwrap();
        assert_eq!(text.matches("Written by liveness").count(), 1, "{text}");
    }
    if let (Some(user), Some(before)) = (&user_file, &before)
        && *user != file
    {
        assert_eq!(
            &std::fs::read(user).unwrap(),
            before,
            "the user's own file is untouched"
        );
    }

    let out = home.hooks(&liveness, None, "uninstall", case);
    assert!(out.status.success(), "{out:?}");
    if let Some(config_before) = &config_before {
        assert_eq!(
            &std::fs::read_to_string(&config).unwrap(),
            config_before,
            "config.toml restored byte for byte"
        );
        assert!(
            !home
                .path()
                .join(".codex/config.toml.liveness-backup")
                .exists()
        );
    }
    match (&user_file, &before) {
        (Some(user), Some(before)) if *user == file => {
            assert_eq!(
                &std::fs::read(&file).unwrap(),
                before,
                "restored byte for byte"
            );
            let backup = format!("{}.liveness-backup", file.display());
            assert!(!Path::new(&backup).exists(), "the backup is gone");
        }
        _ => assert!(!file.exists(), "liveness's own file is gone"),
    }
    let out = home.hooks(&liveness, None, "uninstall", case);
    assert!(out.status.success(), "{out:?}");
}

/// `install` refuses a file that is not the agent's, and changes nothing.
fn refused_unchanged(case: &Case, text: &str, why: &str) {
    let home = Home::new(case);
    let binaries = BinariesForAnyUser::new();
    let file = home.file(case);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, text).unwrap();
    home.give_to_alice(&home.path());
    let names = || {
        let mut names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = names();
    for verb in ["install", "uninstall"] {
        let out = home.hooks(&binaries.path("liveness"), None, verb, case);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if verb == "install" || !stderr.is_empty() {
            assert!(
                !out.status.success() && stderr.contains(why),
                "{verb}: {out:?}"
            );
        }
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text, "{verb}");
    }
    assert_eq!(names(), before, "no backup, no temporary file");
}

/// A link of ALICE's planted at the agent's file, then at its directory, to a directory
/// and file of root's: `install` and `uninstall` refuse, naming the link, and root's
/// files are untouched.
fn planted_links_are_refused(case: &Case) {
    for at_dir in [false, true] {
        let home = Home::new(case);
        let binaries = BinariesForAnyUser::new();
        let roots = home.dir.path().join("root-only");
        std::fs::create_dir(&roots).unwrap();
        std::fs::write(roots.join("file"), "{}").unwrap();
        let file = home.file(case);
        let (link, target) = if at_dir {
            let dir = file.parent().unwrap().to_owned();
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
            (dir, roots.clone())
        } else {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&file);
            (file.clone(), roots.join("file"))
        };
        std::os::unix::fs::symlink(&target, &link).unwrap();
        home.give_to_alice(&home.path());
        for verb in ["install", "uninstall"] {
            let out = home.hooks(&binaries.path("liveness"), None, verb, case);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains("is a symbolic link (to "),
                "{verb} through a link at {link:?}: {out:?}"
            );
            assert_eq!(std::fs::read_dir(&roots).unwrap().count(), 1, "{verb}");
            assert_eq!(std::fs::read_to_string(roots.join("file")).unwrap(), "{}");
        }
    }
}

/// The stand-in agent, run as ALICE under the real agent's name, once its start hooks ran.
struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    _bin: tempfile::TempDir,
}

impl Agent {
    fn start(case: &Case, home: &Home, session: &str) -> Agent {
        Agent::start_under(&[], &[], case, home, session)
    }

    /// [`Agent::start`], run as `PREFIX... AGENT ARGS...` with `env` added to its environment.
    fn start_under(
        prefix: &[&str],
        env: &[(&str, String)],
        case: &Case,
        home: &Home,
        session: &str,
    ) -> Agent {
        let bin = tempfile::tempdir().unwrap();
        set_mode(bin.path(), 0o755);
        let script = if case.agent == "opencode" {
            "opencode-standin.js"
        } else {
            "standin.py"
        };
        let program = bin.path().join(case.binary);
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("agents")
                .join(script),
            &program,
        )
        .unwrap();
        set_mode(&program, 0o755);
        let mut command = match prefix.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        let mut child = command
            .args([session, home.project().to_str().unwrap()])
            .current_dir(home.project())
            .env("HOME", home.path())
            .env_remove("CODEX_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("XDG_CONFIG_HOME")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .uid(ALICE)
            .gid(ALICE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the stand-in agent");
        let mut ready = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut ready).unwrap();
        assert_eq!(
            ready.trim(),
            "ready",
            "the stand-in {} did not start",
            case.binary
        );
        Agent {
            stdin: child.stdin.take(),
            stdout,
            child,
            _bin: bin,
        }
    }

    /// Has the agent fire an activity event (`prompt`, `tool NAME_JSON`, `tool-end`,
    /// `stop`): its hooks ran, and each exited 0.
    fn event(&mut self, line: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{line}").unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), "ok", "{line}: every hook exits 0");
    }

    /// Sends `line` (`exit`, `exit-twice`, `delete`) and waits for a clean exit.
    fn say(mut self, line: &str) {
        writeln!(self.stdin.take().unwrap(), "{line}").unwrap();
        assert!(self.child.wait().unwrap().success());
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn installed_for_alice(case: &Case) -> (Daemon, BinariesForAnyUser, Home) {
    installed_for_alice_with(case, &[])
}

/// [`installed_for_alice`], the daemon started with `args`.
fn installed_for_alice_with(case: &Case, args: &[&str]) -> (Daemon, BinariesForAnyUser, Home) {
    let (daemon, binaries) = shared_daemon_with(args);
    let home = Home::new(case);
    let out = home.hooks(
        &binaries.path("liveness"),
        Some(&daemon.socket),
        "install",
        case,
    );
    assert!(out.status.success(), "{out:?}");
    (daemon, binaries, home)
}

fn get(daemon: &Daemon, session: &str) -> Value {
    daemon.request(serde_json::json!({"op": "get", "session": session, "uid": ALICE}))["session"]
        .clone()
}

/// The agent started with `session`, which its start hook registered, owned by the agent
/// (not the hook's shell): the agent and the session.
fn registered(case: &Case, daemon: &Daemon, home: &Home, session: &str) -> (Agent, Value) {
    let agent = Agent::start(case, home, session);
    let registered = get(daemon, session);
    assert_eq!(registered["phase"], "active", "{registered}");
    assert_eq!(registered["labels"]["agent"], case.agent, "{registered}");
    assert_eq!(
        registered["owner"]["pid"],
        agent.child.id(),
        "the agent owns it"
    );
    (agent, registered)
}

/// (a) SIGKILLed mid-session: the user's end command runs once, as ALICE, with the
/// agent's payload and the exit facts; (b) exiting after its own end hooks, nothing more;
/// (c) its end hooks fired twice: livenessd runs nothing either.
fn end_commands_run_once(case: &Case) {
    let (daemon, _binaries, home) = installed_for_alice(case);
    let (agent, registered) = registered(case, &daemon, &home, "kill-1");
    assert_eq!(
        registered["on_end_run"].as_array().map(Vec::len),
        Some(1),
        "{registered}"
    );
    agent.kill9();
    let ended = daemon.wait_finalized("kill-1", Some(ALICE));
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    let (runs, uids) = home.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(uids, [ALICE], "run as the user");
    let input = &runs[0];
    assert_eq!(input[case.session_key], "kill-1", "{input}");
    assert_eq!(input["liveness"]["exit"]["signal"], 9, "{input}");
    assert_eq!(input["liveness"]["session"], "kill-1", "{input}");

    for (session, line, agent_runs) in [("exit-1", "exit", 1), ("twice-1", "exit-twice", 2)] {
        std::fs::remove_file(home.path().join("end.log")).unwrap();
        Agent::start(case, &home, session).say(line);
        let ended = daemon.wait_finalized(session, Some(ALICE));
        assert_eq!(ended["reason"], "stopped", "{ended}");
        assert_eq!(
            ended["actions"][0]["outcome"]["skipped"], "done_by_agent",
            "{ended}"
        );
        std::thread::sleep(Duration::from_millis(500));
        let (runs, _) = home.runs();
        assert_eq!(runs.len(), agent_runs, "{line}: {runs:?}");
        assert!(
            runs.iter().all(|run| run.get("liveness").is_none()),
            "{runs:?}"
        );
    }
}

/// An agent without end hooks: its session is registered, owned by it, and ends with it.
fn tracked_to_its_exit(case: &Case) {
    let (daemon, _binaries, home) = installed_for_alice(case);
    let (agent, _) = registered(case, &daemon, &home, "track-1");
    agent.kill9();
    let killed = ended(&daemon, "track-1");
    assert_eq!(killed["reason"], "owner_exited", "{killed}");
    assert_eq!(killed["exit"]["signal"], 9, "{killed}");
    if case.agent == "opencode" {
        // A deleted session ends there, while opencode runs on.
        Agent::start(case, &home, "deleted-1").say("delete");
        let deleted = ended(&daemon, "deleted-1");
        assert_eq!(deleted["reason"], "stopped", "{deleted}");
    }
}

/// Kiro 2.x gives its hooks no session id: the session is named after the agent process
/// (`kiro~PID-START`), registered by `agentSpawn`, declared on by the prompt, tool and
/// `stop` hooks of that process, and tracked to its exit; a second agent process is a
/// session of its own.
fn named_after_its_process(case: &Case) {
    let (daemon, _binaries, home) =
        installed_for_alice_with(case, &["--activity-interval", "200ms"]);
    let env = [("STANDIN_KIRO_AGENT", "dev".to_owned())];
    let mut agent = Agent::start_under(&[], &env, case, &home, "unused");
    let other = Agent::start_under(&[], &env, case, &home, "unused");
    let kiro_runs = || -> Vec<Value> {
        let listed = daemon.request(serde_json::json!({"op": "list"}));
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|run| run["creator_uid"] == ALICE && run["labels"]["agent"] == "kiro")
            .cloned()
            .collect()
    };
    let runs = kiro_runs();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let run = runs
        .iter()
        .find(|run| run["owner"]["pid"] == agent.child.id())
        .expect("the agent owns a session");
    let id = run["id"].as_str().unwrap().to_owned();
    assert_eq!(
        id,
        format!("kiro~{}-{}", agent.child.id(), run["owner"]["start_ticks"]),
        "{run}"
    );
    assert_eq!(run["labels"]["agent_session"], id.as_str(), "{run}");

    agent.event("prompt");
    assert!(get(&daemon, &id)["declared"]["turn_since_ms"].is_i64());
    agent.event("tool \"execute_bash\"");
    assert_eq!(get(&daemon, &id)["declared"]["tool"], "execute_bash");
    agent.event("tool-end");
    agent.event("stop");
    let session = get(&daemon, &id);
    assert!(
        session["declared"].get("turn_since_ms").is_none(),
        "{session}"
    );
    let others: Vec<Value> = kiro_runs()
        .into_iter()
        .filter(|run| run["id"] != id.as_str())
        .collect();
    assert!(
        others[0]["declared"].get("turn_since_ms").is_none(),
        "the other agent's session is untouched: {others:?}"
    );

    agent.kill9();
    let killed = ended(&daemon, &id);
    assert_eq!(killed["reason"], "owner_exited", "{killed}");
    assert_eq!(killed["exit"]["signal"], 9, "{killed}");
    assert_eq!(
        get(&daemon, others[0]["id"].as_str().unwrap())["phase"],
        "active"
    );
    other.kill9();
}

/// The agent's prompt and tool hooks declare its turn and tool on its session, which the
/// daemon's judgement shows (`tool` for a tool in flight, `idle` once the turn ended); a
/// tool name of control characters and 4 KiB reaches the daemon escaped and cut, and
/// the hook still exits 0.
fn turns_and_tools_are_declared(case: &Case) {
    let (daemon, _binaries, home) =
        installed_for_alice_with(case, &["--activity-interval", "200ms"]);
    let (mut agent, _) = registered(case, &daemon, &home, "turns-1");
    let state_becomes = |want: &[&str]| {
        let mut last = Value::Null;
        let seen = integration_tests::eventually(Duration::from_secs(10), || {
            last = get(&daemon, "turns-1");
            want.contains(&last["activity"]["state"].as_str().unwrap_or_default())
        });
        assert!(seen, "activity not {want:?}: {last}");
        last
    };

    agent.event("prompt");
    let session = get(&daemon, "turns-1");
    assert!(
        session["declared"]["turn_since_ms"].is_i64(),
        "a turn in flight: {session}"
    );
    state_becomes(&["working", "quiet"]);
    agent.event("tool \"Bash\"");
    assert_eq!(get(&daemon, "turns-1")["declared"]["tool"], "Bash");
    state_becomes(&["tool"]);
    agent.event("tool-end");
    let session = get(&daemon, "turns-1");
    assert!(session["declared"].get("tool").is_none(), "{session}");
    assert!(session["declared"]["turn_since_ms"].is_i64(), "{session}");
    agent.event("stop");
    let session = state_becomes(&["idle"]);
    assert!(
        session["declared"].get("turn_since_ms").is_none(),
        "{session}"
    );

    let hostile = format!("\u{1b}]52;c;eA==\u{7}\n\u{9b}{}", "\u{e9}".repeat(2048));
    agent.event(&format!("tool {}", serde_json::json!(hostile)));
    let session = get(&daemon, "turns-1");
    let tool = session["declared"]["tool"].as_str().unwrap_or_default();
    assert!(
        tool.starts_with("\\u{1b}]52;c;eA==\\u{7}\\n\\u{9b}\u{e9}") && tool.len() <= 128,
        "escaped and cut: {session}"
    );
    assert!(!tool.chars().any(char::is_control), "{tool:?}");
    agent.kill9();
}

/// The session once it has ended (it has no end action to wait for).
fn ended(daemon: &Daemon, session: &str) -> Value {
    let mut last = Value::Null;
    let done = integration_tests::eventually(Duration::from_secs(15), || {
        last = get(daemon, session);
        last["phase"] == "ended"
    });
    assert!(done, "{session} did not end: {last}");
    last
}

macro_rules! agent_tests {
    ($module:ident, $case:expr, $installed:expr, $lifecycle:ident) => {
        mod $module {
            use super::*;

            #[test]
            fn install_matches_the_golden_file_and_uninstall_restores() {
                if privileged(concat!(stringify!($module), "::install")) {
                    install_matches_its_golden_file_and_uninstall_restores(&$case, $installed);
                }
            }

            #[test]
            fn a_planted_link_is_refused() {
                if privileged(concat!(stringify!($module), "::links")) {
                    planted_links_are_refused(&$case);
                }
            }

            #[test]
            fn the_session_is_tracked_and_ended_once() {
                if privileged(concat!(stringify!($module), "::lifecycle")) {
                    $lifecycle(&$case);
                }
            }
        }
    };
}

agent_tests!(codex, CODEX, "installed.json", end_commands_run_once);
agent_tests!(gemini, GEMINI, "installed.json", end_commands_run_once);
agent_tests!(copilot, COPILOT, "installed.json", end_commands_run_once);
agent_tests!(cursor, CURSOR, "installed.json", end_commands_run_once);
agent_tests!(kiro, KIRO, "installed.json", tracked_to_its_exit);
agent_tests!(
    kiro_agent,
    KIRO_AGENT,
    "installed.json",
    named_after_its_process
);
agent_tests!(opencode, OPENCODE, "installed.js", tracked_to_its_exit);

/// [`turns_and_tools_are_declared`] for each agent with prompt and tool hooks.
mod activity {
    use super::*;

    macro_rules! declared {
        ($($agent:ident: $case:expr),*) => {$(
            #[test]
            fn $agent() {
                if privileged(concat!("activity::", stringify!($agent))) {
                    turns_and_tools_are_declared(&$case);
                }
            }
        )*};
    }

    declared!(claude_code: CLAUDE_CODE, codex: CODEX, gemini: GEMINI, copilot: COPILOT, cursor: CURSOR);
}

#[test]
fn files_not_in_the_agents_format_are_refused_unchanged() {
    if !privileged("files_not_in_the_agents_format_are_refused_unchanged") {
        return;
    }
    for case in [&CODEX, &GEMINI, &COPILOT, &CURSOR, &KIRO, &KIRO_AGENT] {
        refused_unchanged(case, "[1, 2]\n", "not a JSON object");
        refused_unchanged(case, "{\"hooks\": 3", "not valid JSON");
    }
    refused_unchanged(&CODEX, "{\"hooks\": []}\n", "\"hooks\" is not an object");
    refused_unchanged(
        &COPILOT,
        "{\"version\": 2, \"hooks\": {}}\n",
        "\"version\" is 2",
    );
    refused_unchanged(&KIRO, "{\"version\": \"v9\"}\n", "\"version\" is \"v9\"");
    // Kiro 2.x: an agent is made in Kiro, and its hooks' triggers are Kiro's.
    refused_unchanged(&KIRO_AGENT, "{}\n", "no Kiro agent \"dev\" here");
    refused_unchanged(
        &KIRO_AGENT,
        "{\"name\": \"dev\", \"hooks\": {\"sessionEnd\": []}}\n",
        "\"hooks.sessionEnd\" is not an event kiro knows",
    );
    // One event Cursor does not know voids the whole file: liveness writes none such.
    refused_unchanged(
        &CURSOR,
        "{\"version\": 1, \"hooks\": {\"onSave\": [{\"command\": \"true\"}]}}\n",
        "\"hooks.onSave\" is not an event cursor knows",
    );
    refused_unchanged(
        &OPENCODE,
        "export const Mine = async () => ({});\n",
        "a plugin liveness did not write",
    );
}

/// `--agent NAME` names a Kiro 2.x agent's file: `status` shows it in Kiro's row; a name
/// that would leave the agents directory, and the option for another agent, are refused
/// before any file is touched.
#[test]
fn a_kiro_agent_is_named_by_agent_and_nothing_else() {
    if !privileged("a_kiro_agent_is_named_by_agent_and_nothing_else") {
        return;
    }
    let home = Home::new(&KIRO_AGENT);
    let binaries = BinariesForAnyUser::new();
    let liveness = binaries.path("liveness");
    assert!(
        home.hooks(&liveness, None, "install", &KIRO_AGENT)
            .status
            .success()
    );
    let status = Command::new(&liveness)
        .args(["--json", "hooks", "status", "--agent", "dev"])
        .env("HOME", home.path())
        .uid(ALICE)
        .gid(ALICE)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let rows: Value = serde_json::from_slice(&status.stdout).unwrap();
    let kiro = rows["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["agent"] == "kiro")
        .unwrap()
        .clone();
    assert_eq!(kiro["installed"], true, "{kiro}");
    assert_eq!(
        kiro["file"],
        home.file(&KIRO_AGENT).to_str().unwrap(),
        "{kiro}"
    );
    let before = std::fs::read_dir(home.path()).unwrap().count();
    for args in [
        &["hooks", "install", "kiro", "--agent", "../../x"][..],
        &["hooks", "install", "kiro", "--agent", ".dev"],
        &["hooks", "install", "codex", "--agent", "dev"],
        &["hooks", "status", "--agent", "a/b"],
    ] {
        let out = Command::new(&liveness)
            .args(args)
            .env("HOME", home.path())
            .uid(ALICE)
            .gid(ALICE)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
    }
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), before);
    assert!(!home.path().join(".codex").exists());
}

#[test]
fn status_says_per_agent_what_is_installed_and_where() {
    let home = Home::new(&GEMINI);
    let binaries = BinariesForAnyUser::new();
    let liveness = binaries.path("liveness");
    assert!(
        home.hooks(&liveness, None, "install", &COPILOT)
            .status
            .success()
    );
    // Gemini CLI as npm installs it: a link on PATH to a file of the package.
    let npm = home.dir.path().join("npm");
    let package = npm.join("lib/node_modules/@google/gemini-cli");
    std::fs::create_dir_all(package.join("bundle")).unwrap();
    std::fs::create_dir_all(npm.join("bin")).unwrap();
    std::fs::write(
        package.join("package.json"),
        r#"{"name": "@google/gemini-cli", "version": "0.61.0"}"#,
    )
    .unwrap();
    std::fs::write(package.join("bundle/gemini.js"), "").unwrap();
    std::os::unix::fs::symlink(package.join("bundle/gemini.js"), npm.join("bin/gemini")).unwrap();
    let status = |json: bool| {
        let mut command = Command::new(&liveness);
        if json {
            command.arg("--json");
        }
        command
            .args(["hooks", "status"])
            .env("HOME", home.path())
            .env_remove("CODEX_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("XDG_CONFIG_HOME")
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", npm.join("bin").display()),
            )
            .output()
            .unwrap()
    };
    let out = status(true);
    assert!(out.status.success(), "{out:?}");
    let agents: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = |name: &str| {
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["agent"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {agents}"))
    };
    assert_eq!(row("copilot")["installed"], true);
    assert_eq!(
        row("copilot")["file"],
        home.file(&COPILOT).to_str().unwrap()
    );
    assert_eq!(
        row("gemini")["installed"],
        false,
        "the user's own hooks are not ours"
    );
    assert_eq!(row("kiro")["end_hook"], false);
    assert_eq!(row("codex")["end_hook"], true);
    assert_eq!(
        row("gemini")["version"],
        "0.61.0",
        "read from npm's package.json"
    );
    assert_eq!(row("codex")["version"], Value::Null, "no codex on PATH");
    let text = String::from_utf8(status(false).stdout).unwrap();
    let line = text.lines().find(|l| l.starts_with("copilot ")).unwrap();
    assert!(
        line.contains(" installed ") && line.contains("liveness.json"),
        "{text}"
    );
}

/// `hooks status` says whether Codex trusts liveness's hooks; a `config.toml` where no
/// table can be added, or that is a link, is refused with the hooks file left unchanged.
#[test]
fn codex_s_trust_is_recorded_checked_and_refused_where_it_cannot_be_added() {
    let home = Home::new(&CODEX);
    let liveness = BinariesForAnyUser::new().path("liveness");
    let config = home.path().join(".codex/config.toml");
    let trusted = || {
        let out = Command::new(&liveness)
            .args(["--json", "hooks", "status"])
            .env("HOME", home.path())
            .env_remove("CODEX_HOME")
            .output()
            .unwrap();
        let agents: Value = serde_json::from_slice(&out.stdout).unwrap();
        let row = agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["agent"] == "codex")
            .cloned()
            .unwrap();
        row["trusted"].clone()
    };
    assert_eq!(trusted(), Value::Null, "not installed");
    let users = std::fs::read_to_string(&config).unwrap();
    assert!(
        home.hooks(&liveness, None, "install", &CODEX)
            .status
            .success()
    );
    assert_eq!(trusted(), true);
    // Codex's trust lost (the user reset config.toml): status says so.
    std::fs::write(&config, &users).unwrap();
    assert_eq!(trusted(), false);
    let text = Command::new(&liveness)
        .args(["hooks", "status"])
        .env("HOME", home.path())
        .env_remove("CODEX_HOME")
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("codex ") && l.contains("not trusted")),
        "{text}"
    );

    // Hooks set inline, where no table can be added; a link planted at config.toml: each
    // refused, with nothing written, and what the link points to untouched.
    let home = Home::new(&CODEX);
    let hooks_file = home.file(&CODEX);
    let hooks_before = std::fs::read(&hooks_file).unwrap();
    let config = home.path().join(".codex/config.toml");
    let roots = home.dir.path().join("root-only.toml");
    std::fs::write(&roots, "x = 1\n").unwrap();
    for (planted, why) in [
        (false, "sets hooks inline"),
        (true, "is a symbolic link (to "),
    ] {
        std::fs::remove_file(&config).unwrap();
        match planted {
            true => std::os::unix::fs::symlink(&roots, &config).unwrap(),
            false => std::fs::write(&config, "hooks = { }\n").unwrap(),
        }
        let before = std::fs::read_to_string(&config).unwrap();
        let out = home.hooks(&liveness, None, "install", &CODEX);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(why), "{out:?}");
        assert_eq!(std::fs::read(&hooks_file).unwrap(), hooks_before);
        assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
    }
    assert_eq!(std::fs::read_to_string(&roots).unwrap(), "x = 1\n");
}

#[test]
fn the_hooks_name_the_liveness_on_path_when_it_is_the_same_file() {
    let home = Home::new(&CODEX);
    let binaries = BinariesForAnyUser::new();
    let liveness = binaries.path("liveness");
    let bin = home.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(&liveness, bin.join("liveness")).unwrap();
    let install = |path: &str| {
        Command::new(&liveness)
            .args(["hooks", "install", "codex"])
            .env("HOME", home.path())
            .env_remove("CODEX_HOME")
            .env("PATH", path)
            .output()
            .unwrap()
    };
    let out = install(&format!("{}:/usr/bin:/bin", bin.display()));
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(home.file(&CODEX)).unwrap();
    let named = format!("\"{}/liveness hooks codex session-start\"", bin.display());
    assert!(text.contains(&named), "{text}");
    // Another liveness first on PATH: the hooks name this binary's own file.
    std::fs::remove_file(bin.join("liveness")).unwrap();
    std::fs::copy(&liveness, bin.join("liveness")).unwrap();
    let out = install(&format!("{}:/usr/bin:/bin", bin.display()));
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(home.file(&CODEX)).unwrap();
    let named = format!("\"{} hooks codex session-start\"", liveness.display());
    assert!(text.contains(&named), "{text}");
}

/// A hook's bound on its wait for the daemon: its connection and every request together
/// take at most 150 ms, so that with the hook's own start it returns within 200 ms.
const HOOK_BOUND: Duration = Duration::from_millis(200);

/// Runs `hook` of Gemini's for `session` from `sh -c`, as Gemini does: its output and how
/// long it took.
fn gemini_hook(socket: &Path, hook: &str, session: &str) -> (Output, Duration) {
    let line = format!(
        "echo '{{\"session_id\": \"{session}\", \"cwd\": \"/\"}}' | {} --socket {} hooks gemini {hook}",
        integration_tests::binary("liveness").display(),
        socket.display()
    );
    let started = std::time::Instant::now();
    let out = Command::new("sh").args(["-c", &line]).output().unwrap();
    (out, started.elapsed())
}

/// Asserts that the hook `run` exited 0, wrote nothing on stdout, said on stderr that the
/// daemon did not answer in time, and returned within [`HOOK_BOUND`] of the cost of a hook
/// that finds no daemon at all, run just before (which is the debug build's start on a
/// machine the tests share: `cargo xtask bench --part hooks` measures the release build's).
fn gave_up_in_time(what: &str, no_daemon: &Path, run: impl FnOnce() -> (Output, Duration)) {
    let (_, start) = gemini_hook(no_daemon, "session-start", "gone");
    let (out, took) = run();
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{what}: {out:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("did not answer in time (150 ms for its first answer"),
        "{what}: {stderr}"
    );
    assert!(
        took.saturating_sub(start) < HOOK_BOUND,
        "{what}: {took:?}, a hook with no daemon {start:?}: {stderr}"
    );
    eprintln!("{what}: the hook returned after {took:?}, one with no daemon after {start:?}");
}

/// Connections the daemon has not accepted, until its listen backlog is full (a connection
/// that would wait is refused with `EAGAIN`, non-blocking).
fn fill_backlog(socket: &Path) -> Vec<rustix::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let address = SocketAddrUnix::new(socket).unwrap();
    let mut held = Vec::new();
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        match rustix::net::connect(&fd, &address) {
            Ok(()) => held.push(fd),
            Err(rustix::io::Errno::AGAIN) => return held,
            Err(e) => panic!("connection {} to the frozen daemon: {e}", held.len()),
        }
        assert!(held.len() < 100_000, "the backlog never filled");
    }
}

#[test]
fn a_hook_never_holds_the_agent_up_when_the_daemon_is_gone_or_frozen() {
    if !privileged("a_hook_never_holds_the_agent_up_when_the_daemon_is_gone_or_frozen") {
        return;
    }
    let mut daemon = Daemon::start(&[]);
    let (out, _) = gemini_hook(&daemon.socket, "session-start", "up-1");
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert_eq!(daemon.session("up-1")["phase"], "active");

    let (out, took) = gemini_hook(
        &daemon.dir.path().join("no.sock"),
        "session-start",
        "gone-1",
    );
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(!out.stderr.is_empty(), "it says why on stderr");
    assert!(took < HOOK_BOUND, "{took:?} with no daemon");

    daemon.signal(libc::SIGSTOP);
    let gone = daemon.dir.path().join("no.sock");
    for hook in ["session-start", "session-end", "turn-start"] {
        gave_up_in_time(&format!("a frozen daemon, {hook}"), &gone, || {
            gemini_hook(&daemon.socket, hook, "up-1")
        });
    }
    // A frozen daemon's backlog fills up, and then connecting itself waits.
    let held = fill_backlog(&daemon.socket);
    gave_up_in_time(
        &format!("a frozen daemon with {} connections waiting", held.len()),
        &gone,
        || gemini_hook(&daemon.socket, "session-start", "frozen-2"),
    );
    drop(held);
    daemon.signal(libc::SIGCONT);
    // Once the daemon has worked through the connections that waited, hooks register again.
    assert_eq!(daemon.session("up-1")["phase"], "active");
    let (out, _) = gemini_hook(&daemon.socket, "session-start", "thawed-1");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(daemon.session("thawed-1")["phase"], "active", "{out:?}");
    let _ = daemon.stop();
}

#[test]
fn a_slow_end_command_of_an_agent_killed_while_the_daemon_was_down_completes_once() {
    if !privileged("a_slow_end_command_of_an_agent_killed_while_the_daemon_was_down_completes_once")
    {
        return;
    }
    let (mut daemon, _binaries, home) = installed_for_alice(&GEMINI);
    // The user's end command takes 5 s (Gemini gives it 30 s): it must complete, once.
    let settings = home.file(&GEMINI);
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(&settings, text.replace("id -u >>", "sleep 5; id -u >>")).unwrap();
    let (agent, _) = registered(&GEMINI, &daemon, &home, "down-1");
    daemon.stop();
    agent.kill9();
    daemon.restart();
    let ended = daemon.wait_finalized("down-1", Some(ALICE));
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    assert_eq!(ended["actions"][0]["outcome"]["exit"]["code"], 0, "{ended}");
    std::thread::sleep(Duration::from_millis(500));
    let (runs, uids) = home.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(uids, [ALICE]);
    assert_eq!(runs[0]["session_id"], "down-1");
    assert_eq!(runs[0]["liveness"]["reason"], "owner_exited", "{}", runs[0]);
}

#[test]
fn root_installing_for_a_user_leaves_every_agent_s_files_theirs() {
    if !privileged("root_installing_for_a_user_leaves_every_agent_s_files_theirs") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let binaries = BinariesForAnyUser::new();
    for case in [
        &CODEX,
        &GEMINI,
        &COPILOT,
        &CURSOR,
        &KIRO,
        &KIRO_AGENT,
        &OPENCODE,
    ] {
        let home = Home::new(case);
        let out = Command::new(binaries.path("liveness"))
            .args(["hooks", "install", case.agent])
            .args(case.args)
            .env("HOME", home.path())
            .env_remove("CODEX_HOME")
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {out:?}", case.agent);
        let file = home.file(case);
        let mut path = file.as_path();
        while path != home.path() {
            let meta = std::fs::symlink_metadata(path).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (ALICE, ALICE), "{path:?}");
            path = path.parent().unwrap();
        }
        if case.user != Some(case.file) {
            let mode = std::fs::metadata(&file).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file:?}: liveness's own file is private");
        }
    }
}

/// Every run of the agent session `session` of ALICE's, oldest first: the one under
/// `session` and those labelled with it.
fn runs_of(daemon: &Daemon, session: &str) -> Vec<Value> {
    let listed = daemon.request(serde_json::json!({"op": "list"}));
    listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|run| run["creator_uid"] == ALICE && run["labels"]["agent_session"] == session)
        .cloned()
        .collect()
}

/// (e) A resume of an ended session is a new run of it: tracked, owned by the resumed
/// agent, and given the user's end command again when it is killed; the ended run stays
/// readable.
#[test]
fn a_resumed_session_is_a_new_run_whose_end_command_runs_again() {
    if !privileged("a_resumed_session_is_a_new_run_whose_end_command_runs_again") {
        return;
    }
    let (daemon, _binaries, home) = installed_for_alice(&GEMINI);
    let (first, _) = registered(&GEMINI, &daemon, &home, "resume-1");
    first.kill9();
    daemon.wait_finalized("resume-1", Some(ALICE));
    let resumed = Agent::start(&GEMINI, &home, "resume-1");
    let runs = runs_of(&daemon, "resume-1");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["id"], "resume-1");
    assert_eq!(runs[0]["phase"], "ended", "the first run stays readable");
    let run = runs[1]["id"].as_str().unwrap().to_owned();
    assert!(run.starts_with("resume-1~"), "{run}");
    assert_eq!(runs[1]["phase"], "active", "{}", runs[1]);
    assert_eq!(runs[1]["owner"]["pid"], resumed.child.id(), "{}", runs[1]);
    resumed.kill9();
    let ended = daemon.wait_finalized(&run, Some(ALICE));
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    std::thread::sleep(Duration::from_millis(500));
    let (inputs, uids) = home.runs();
    assert_eq!(inputs.len(), 2, "once per run: {inputs:?}");
    assert_eq!(uids, [ALICE, ALICE]);
    assert_eq!(inputs[1]["session_id"], "resume-1", "{}", inputs[1]);
    assert_eq!(
        inputs[1]["liveness"]["session"],
        run.as_str(),
        "{}",
        inputs[1]
    );
    assert_eq!(inputs[1]["liveness"]["exit"]["signal"], 9, "{}", inputs[1]);
    assert_eq!(get(&daemon, "resume-1")["reason"], "owner_exited");
}

/// (e) A fork of a live session (Codex and Claude Code give it the session id of the run
/// it came from) is a run of its own: killed, its end command runs once and the live run
/// goes on; a second fork's own end hook ends only its run; the first run's later death
/// runs its own end command once.
#[test]
fn a_fork_of_a_live_session_is_a_run_of_its_own_that_ends_nothing_else() {
    if !privileged("a_fork_of_a_live_session_is_a_run_of_its_own_that_ends_nothing_else") {
        return;
    }
    let (daemon, _binaries, home) = installed_for_alice(&CODEX);
    let (first, _) = registered(&CODEX, &daemon, &home, "live-1");
    let fork = Agent::start(&CODEX, &home, "live-1");
    let session = get(&daemon, "live-1");
    assert_eq!(
        session["owner"]["pid"],
        first.child.id(),
        "not taken over: {session}"
    );
    let runs = runs_of(&daemon, "live-1");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1]["owner"]["pid"], fork.child.id(), "{}", runs[1]);
    let fork_run = runs[1]["id"].as_str().unwrap().to_owned();

    fork.kill9();
    let ended = daemon.wait_finalized(&fork_run, Some(ALICE));
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        get(&daemon, "live-1")["phase"],
        "active",
        "the fork ended only its run"
    );
    let (inputs, _) = home.runs();
    assert_eq!(inputs.len(), 1, "the fork's, once: {inputs:?}");
    assert_eq!(
        inputs[0]["liveness"]["session"],
        fork_run.as_str(),
        "{}",
        inputs[0]
    );

    // A second fork exits by itself: its end hook ends its run, and no other.
    let second = Agent::start(&CODEX, &home, "live-1");
    let second_run = runs_of(&daemon, "live-1")[2]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    second.say("exit");
    let ended = daemon.wait_finalized(&second_run, Some(ALICE));
    assert_eq!(ended["reason"], "stopped", "{ended}");
    assert_eq!(
        ended["actions"][0]["outcome"]["skipped"], "done_by_agent",
        "{ended}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(&daemon, "live-1")["phase"], "active");
    assert_eq!(home.runs().0.len(), 2, "the second fork's, by the fork");

    first.kill9();
    let ended = daemon.wait_finalized("live-1", Some(ALICE));
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    std::thread::sleep(Duration::from_millis(500));
    let (inputs, _) = home.runs();
    assert_eq!(inputs.len(), 3, "{inputs:?}");
    assert_eq!(inputs[2]["liveness"]["session"], "live-1", "{}", inputs[2]);
    assert_eq!(inputs[2]["liveness"]["exit"]["signal"], 9, "{}", inputs[2]);
}

/// Another user's agent naming ALICE's live session id (a resume, or hooks run by hand)
/// registers and ends a session of its own: ALICE's keeps its owner and end commands, and
/// nothing of hers runs.
#[test]
fn another_user_cannot_resume_or_end_a_user_s_session() {
    if !privileged("another_user_cannot_resume_or_end_a_user_s_session") {
        return;
    }
    const MALLORY: u32 = 61_054;
    let (daemon, binaries, home) = installed_for_alice(&CODEX);
    let (agent, before) = registered(&CODEX, &daemon, &home, "mine-1");
    // Mallory's own process runs the start hook, then the end hook, as an agent would.
    let hook = |name: &str| {
        format!(
            "echo '{{\"session_id\": \"mine-1\", \"cwd\": \"/\"}}' | {} --socket {} hooks codex {name}",
            binaries.path("liveness").display(),
            daemon.socket.display()
        )
    };
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import subprocess, sys\nfor line in sys.argv[1:]: subprocess.check_call(['sh', '-c', line])",
            &hook("session-start"),
            &hook("session-end"),
        ])
        .current_dir("/")
        .env("HOME", "/nonexistent")
        .uid(MALLORY)
        .gid(MALLORY)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let theirs =
        daemon.request(serde_json::json!({"op": "get", "session": "mine-1", "uid": MALLORY}));
    assert_eq!(theirs["session"]["reason"], "stopped", "{theirs}");
    let after = get(&daemon, "mine-1");
    assert_eq!(after["phase"], "active", "{after}");
    assert_eq!(after["owner"], before["owner"], "{after}");
    assert_eq!(after["on_end_run"], before["on_end_run"], "{after}");
    assert_eq!(runs_of(&daemon, "mine-1").len(), 1);
    agent.kill9();
    daemon.wait_finalized("mine-1", Some(ALICE));
    std::thread::sleep(Duration::from_millis(500));
    let (inputs, uids) = home.runs();
    assert_eq!((inputs.len(), uids), (1, vec![ALICE]), "{inputs:?}");
}

#[test]
fn a_session_the_daemon_gave_to_a_wrapper_above_the_agent_is_still_the_agent_s() {
    if !privileged("a_session_the_daemon_gave_to_a_wrapper_above_the_agent_is_still_the_agent_s") {
        return;
    }
    // livenessd --wrapper cursor-agent skips the agent itself: the owner is the process
    // above it, a launcher of the user's. The agent's end hook must still end its session.
    let (daemon, _) = integration_tests::shared_daemon_with(&["--wrapper", "cursor-agent"]);
    let home = Home::new(&CURSOR);
    let liveness = BinariesForAnyUser::new().path("liveness");
    let out = home.hooks(&liveness, Some(&daemon.socket), "install", &CURSOR);
    assert!(out.status.success(), "{out:?}");
    let launcher = [
        "/usr/bin/python3",
        "-c",
        "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))",
    ];
    let agent = Agent::start_under(&launcher, &[], &CURSOR, &home, "wrapped-1");
    let session = get(&daemon, "wrapped-1");
    assert_eq!(session["owner"]["comm"], "python3", "{session}");
    agent.say("exit");
    let ended = daemon.wait_finalized("wrapped-1", Some(ALICE));
    assert_eq!(ended["reason"], "stopped", "{ended}");
    assert_eq!(
        ended["actions"][0]["outcome"]["skipped"], "done_by_agent",
        "{ended}"
    );
}

#[test]
fn an_end_command_livenessd_runs_sees_the_agent_s_path_home_and_session_variables() {
    if !privileged("an_end_command_livenessd_runs_sees_the_agent_s_path_home_and_session_variables")
    {
        return;
    }
    // The user's end command is a script in a directory only the agent's PATH names, which
    // records the environment it runs with.
    let (daemon, _binaries, home) = installed_for_alice(&GEMINI);
    let bin = home.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let script = bin.join("notify-end");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nenv > {}/end.env\n", home.path().display()),
    )
    .unwrap();
    set_mode(&script, 0o755);
    home.give_to_alice(&bin);
    let settings = home.file(&GEMINI);
    let text = std::fs::read_to_string(&settings).unwrap();
    let user_command = text
        .lines()
        .find(|line| line.contains("id -u >>"))
        .unwrap()
        .to_owned();
    std::fs::write(
        &settings,
        text.replace(&user_command, r#"            "command": "notify-end","#),
    )
    .unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let env = [
        ("PATH", path.clone()),
        ("LD_PRELOAD", String::new()),
        ("AGENT_SECRET", "not for the end command".to_owned()),
    ];
    let agent = Agent::start_under(&[], &env, &GEMINI, &home, "env-1");
    agent.kill9();
    let ended = daemon.wait_finalized("env-1", Some(ALICE));
    assert_eq!(ended["actions"][0]["outcome"]["exit"]["code"], 0, "{ended}");
    let recorded = std::fs::read_to_string(home.path().join("end.env")).unwrap();
    let vars: Vec<&str> = recorded.lines().collect();
    for want in [
        format!("PATH={path}"),
        format!("HOME={}", home.path().display()),
        "GEMINI_SESSION_ID=env-1".to_owned(),
        format!("GEMINI_PROJECT_DIR={}", home.project().display()),
        "LIVENESS_EXIT_SIGNAL=9".to_owned(),
    ] {
        assert!(vars.contains(&want.as_str()), "{want} in:\n{recorded}");
    }
    assert!(
        !vars
            .iter()
            .any(|var| var.starts_with("AGENT_SECRET=") || var.starts_with("LD_PRELOAD=")),
        "only the named variables pass:\n{recorded}"
    );
}

/// `install --cgroup` and its limits: the session-start hook is written with them (sizes
/// in bytes) and registers each agent session with a cgroup, here on a host without
/// usable cgroup2 (a hybrid one) without one, with the daemon's warning on stderr; a
/// hostile value is refused as a usage error and nothing is written; `uninstall` knows
/// the hook with its options as liveness's.
#[test]
fn install_with_a_cgroup_writes_its_limits_into_the_start_hook_and_refuses_hostile_ones() {
    let daemon = Daemon::start(&[]);
    let home = Home::new(&GEMINI);
    let liveness = integration_tests::binary("liveness");
    let file = home.file(&GEMINI);
    let hooks = |args: &[&str]| {
        Command::new(&liveness)
            .arg("--socket")
            .arg(&daemon.socket)
            .arg("hooks")
            .args(args)
            .env("HOME", home.path())
            .output()
            .unwrap()
    };
    let before = std::fs::read(&file).unwrap();
    for hostile in [
        &["--cgroup", "--memory-max", "1G; rm -rf /"][..],
        &["--cgroup", "--memory-high", "$(reboot)"],
        &["--cgroup", "--tasks-max", "0"],
        &["--cgroup", "--cpu-weight", "10001"],
        &["--cgroup", "--on-oom", "end`id`"],
        &["--memory-max", "2G"],
    ] {
        let out = hooks(&[&["install", "gemini"][..], hostile].concat());
        assert_eq!(out.status.code(), Some(64), "{hostile:?}: {out:?}");
        assert_eq!(
            std::fs::read(&file).unwrap(),
            before,
            "{hostile:?}: unchanged"
        );
        assert!(!backup_exists(&file), "{hostile:?}: no backup made");
    }

    let limits = [
        "--cgroup",
        "--memory-max",
        "2G",
        "--memory-high",
        "1536M",
        "--tasks-max",
        "64",
        "--cpu-weight",
        "50",
    ];
    let out = hooks(&[&["install", "gemini"][..], &limits].concat());
    assert!(out.status.success(), "{out:?}");
    let settings: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let commands: Vec<String> = settings["hooks"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|entries| entries.as_array().unwrap().clone())
        .flat_map(|entry| entry["hooks"].as_array().unwrap().clone())
        .filter_map(|hook| hook["command"].as_str().map(str::to_owned))
        .filter(|line| line.contains(" hooks gemini "))
        .collect();
    let start = format!(
        "{} --socket {} hooks gemini session-start --cgroup --memory-max 2147483648 --memory-high 1610612736 --tasks-max 64 --cpu-weight 50",
        liveness.display(),
        daemon.socket.display()
    );
    assert!(commands.contains(&start), "{commands:#?}");
    assert!(
        commands
            .iter()
            .filter(|line| !line.contains("session-start"))
            .all(|line| !line.contains("--cgroup")),
        "only the start hook registers: {commands:#?}"
    );

    // The agent runs the line with `sh -c`.
    let line = format!("echo '{{\"session_id\": \"cg-1\", \"cwd\": \"/\"}}' | {start}");
    let out = Command::new("sh").args(["-c", &line]).output().unwrap();
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    let session = daemon.session("cg-1");
    assert_eq!(session["phase"], "active", "{session}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let status = daemon.request(serde_json::json!({"op": "status"}));
    if status["status"]["cgroup"]["usable"] == true {
        assert_eq!(session["cgroup"]["memory_max"], 2u64 << 30, "{session}");
        assert_eq!(session["cgroup"]["tasks_max"], 64, "{session}");
    } else {
        assert!(session.get("cgroup").is_none(), "{session}");
        assert!(stderr.contains("the session has no cgroup"), "{stderr}");
    }

    let out = hooks(&["uninstall", "gemini"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "restored byte for byte"
    );
}

/// Whether `install` left a copy of `file` beside it.
fn backup_exists(file: &Path) -> bool {
    Path::new(&format!("{}.liveness-backup", file.display())).exists()
}
