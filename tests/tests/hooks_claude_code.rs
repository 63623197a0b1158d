//! The Claude Code adapter end to end: `liveness hooks install claude-code` edits the
//! settings (idempotently, with a backup, keeping the user's hooks), and a stand-in agent
//! that follows Claude Code's hook protocol (`tests/agents/claude-code-standin.py`) runs
//! the hooks. The user's SessionEnd command then runs exactly once per session: by
//! livenessd when the agent is SIGKILLed, by the agent when it exits on its own.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use integration_tests::{Daemon, privileged};
use serde_json::{Value, json};

/// A user's Claude Code configuration, a project, and where the user's SessionEnd command
/// writes the hook input it gets.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let setup = Setup {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        std::fs::create_dir_all(setup.config()).unwrap();
        std::fs::create_dir_all(setup.project()).unwrap();
        let log = setup.log();
        let settings = json!({
            "model": "opus",
            "hooks": {
                "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "true"}]}],
                "SessionEnd": [{"hooks": [{"type": "command",
                    "command": format!("cat >> {log}; echo >> {log}", log = log.display())}]}],
            },
        });
        std::fs::write(
            setup.settings(),
            serde_json::to_string_pretty(&settings).unwrap(),
        )
        .unwrap();
        setup
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("claude")
    }

    fn settings(&self) -> PathBuf {
        self.config().join("settings.json")
    }

    fn project(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("session-end.log")
    }

    /// The hook inputs the user's SessionEnd command got, one per run.
    fn runs(&self) -> Vec<Value> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_str(line).expect("the hook input is JSON"))
            .collect()
    }

    fn install(&self, daemon: &Daemon) {
        let settings = self.settings();
        let out = daemon.cli(&[
            "hooks",
            "install",
            "claude-code",
            "--settings",
            path(&settings),
        ]);
        assert!(out.status.success(), "{out:?}");
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// The stand-in agent, started in the project, once its SessionStart hooks have run.
struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Agent {
    fn start(setup: &Setup, session: &str) -> Agent {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/claude-code-standin.py");
        let transcript = setup.dir.path().join(format!("{session}.jsonl"));
        let mut child = Command::new("python3")
            .arg(script)
            .args([session, path(&setup.project()), path(&transcript)])
            .env("CLAUDE_CONFIG_DIR", setup.config())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the stand-in agent (python3)");
        let mut ready = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "ready", "the stand-in agent did not start");
        Agent {
            stdin: child.stdin.take(),
            child,
        }
    }

    /// Ends the session as `/exit` does: the agent runs its SessionEnd hooks and exits.
    fn exit(mut self) {
        writeln!(self.stdin.take().unwrap(), "exit").unwrap();
        assert!(self.child.wait().unwrap().success());
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn session(daemon: &Daemon, id: &str) -> Value {
    daemon.request(json!({"op": "get", "session": id}))["session"].clone()
}

#[test]
fn install_is_idempotent_keeps_the_users_hooks_and_uninstall_restores_the_file() {
    let setup = Setup::new();
    let daemon_less = |args: &[&str]| {
        Command::new(integration_tests::binary("liveness"))
            .args(args)
            .output()
            .unwrap()
    };
    let settings = setup.settings();
    let original = std::fs::read(&settings).unwrap();
    let install = [
        "hooks",
        "install",
        "claude-code",
        "--settings",
        path(&settings),
    ];
    assert!(daemon_less(&install).status.success());
    let once = std::fs::read(&settings).unwrap();
    assert_ne!(once, original);
    let out = daemon_less(&install);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(&settings).unwrap(), once, "byte-identical");
    let backup = setup.config().join("settings.json.liveness-backup");
    assert_eq!(
        std::fs::read(&backup).unwrap(),
        original,
        "the backup is the original"
    );
    let installed: Value = serde_json::from_slice(&once).unwrap();
    assert_eq!(installed["model"], "opus");
    assert_eq!(installed["hooks"]["PreToolUse"][0]["matcher"], "Bash");
    let ends = installed["hooks"]["SessionEnd"].as_array().unwrap();
    assert_eq!(
        ends.len(),
        2,
        "the user's SessionEnd command is kept: {ends:?}"
    );
    let starts = installed["hooks"]["SessionStart"].to_string();
    assert!(
        starts.contains("hooks claude-code session-start"),
        "{starts}"
    );

    let out = daemon_less(&[
        "hooks",
        "uninstall",
        "claude-code",
        "--settings",
        path(&settings),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(&settings).unwrap(),
        original,
        "restored byte for byte"
    );
    assert!(!backup.exists());
    let unknown = daemon_less(&["hooks", "install", "codex-x", "--settings", path(&settings)]);
    assert_eq!(unknown.status.code(), Some(64), "{unknown:?}");
}

#[test]
fn a_killed_agent_has_its_session_end_command_run_once_by_liveness() {
    if !privileged("a_killed_agent_has_its_session_end_command_run_once_by_liveness") {
        return;
    }
    let setup = Setup::new();
    let daemon = Daemon::start(&[]);
    setup.install(&daemon);
    let agent = Agent::start(&setup, "abc-123");
    let registered = session(&daemon, "abc-123");
    assert_eq!(registered["phase"], "active", "{registered}");
    assert_eq!(registered["labels"]["agent"], "claude-code", "{registered}");
    assert_eq!(registered["on_end_run"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        registered["owner"]["pid"],
        agent.child.id(),
        "the agent owns it"
    );

    agent.kill9();
    let ended = daemon.wait_finalized("abc-123", None);
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    let runs = setup.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let input = &runs[0];
    assert_eq!(input["session_id"], "abc-123");
    assert_eq!(input["cwd"], path(&setup.project()));
    let transcript = setup.dir.path().join("abc-123.jsonl");
    assert_eq!(input["transcript_path"], path(&transcript));
    assert_eq!(input["hook_event_name"], "SessionEnd");
    assert_eq!(input["reason"], "other");
    assert_eq!(input["liveness"]["session"], "abc-123");
    assert_eq!(input["liveness"]["exit"]["signal"], 9, "{input}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(setup.runs().len(), 1, "once");
}

#[test]
fn an_agent_that_runs_its_own_session_end_is_not_repeated_by_liveness() {
    if !privileged("an_agent_that_runs_its_own_session_end_is_not_repeated_by_liveness") {
        return;
    }
    let setup = Setup::new();
    let daemon = Daemon::start(&[]);
    setup.install(&daemon);
    let agent = Agent::start(&setup, "def-456");
    agent.exit();
    let ended = daemon.wait_finalized("def-456", None);
    assert_eq!(ended["reason"], "stopped", "{ended}");
    assert_eq!(
        ended["actions"][0]["outcome"]["skipped"], "done_by_agent",
        "{ended}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let runs = setup.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["reason"], "prompt_input_exit", "run by the agent");
    assert!(runs[0].get("liveness").is_none());
}
