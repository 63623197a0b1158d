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
    // The hook's own `liveness` (and the shell it runs in, where the shell forks rather than
    // execs), members of the agent's tree, ended the session: they are set apart, not
    // listed as its survivors (the user's command, run beside it, may still be one).
    let comms = |list: &str| -> Vec<Value> {
        (ended["survivors"][list].as_array().into_iter().flatten())
            .map(|process| process["comm"].clone())
            .collect()
    };
    assert_eq!(
        comms("requested_by").first(),
        Some(&json!("liveness")),
        "{ended}"
    );
    assert!(!comms("members").contains(&json!("liveness")), "{ended}");
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

// Root installing for a user (a provisioning script, `sudo -E`): the user's HOME,
// `CLAUDE_CONFIG_DIR` or settings file may hold links and files the user planted.

/// The user root installs for.
const ALICE: u32 = 61_051;
/// Another user, who must read nothing of ALICE's.
const EVE: u32 = 61_052;
/// What root's own file holds.
const ROOTS: &str = "root's own file";
/// A secret in ALICE's settings.
const KEY: &str = "sk-alice-0123456789";

/// ALICE's home, in a directory anyone may traverse, and beside it a directory only root
/// may enter, holding a file of root's (mode 0640).
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let home = Home {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        set_mode(home.dir.path(), 0o755);
        std::fs::create_dir(home.home()).unwrap();
        set_mode(&home.home(), 0o755);
        std::os::unix::fs::chown(home.home(), Some(ALICE), Some(ALICE)).unwrap();
        std::fs::create_dir(home.root_only()).unwrap();
        set_mode(&home.root_only(), 0o700);
        std::fs::write(home.roots_file(), ROOTS).unwrap();
        set_mode(&home.roots_file(), 0o640);
        home
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("alice")
    }

    fn claude(&self) -> PathBuf {
        self.home().join(".claude")
    }

    fn settings(&self) -> PathBuf {
        self.claude().join("settings.json")
    }

    fn backup(&self) -> PathBuf {
        self.claude().join("settings.json.liveness-backup")
    }

    fn root_only(&self) -> PathBuf {
        self.dir.path().join("root-only")
    }

    fn roots_file(&self) -> PathBuf {
        self.root_only().join("file")
    }

    /// ALICE's `~/.claude` (mode `dir_mode`) and her settings (mode `mode`), with a key and
    /// a SessionEnd command of hers.
    fn with_settings(&self, dir_mode: u32, mode: u32) -> Vec<u8> {
        std::fs::create_dir(self.claude()).unwrap();
        set_mode(&self.claude(), dir_mode);
        let text = serde_json::to_vec_pretty(&json!({
            "env": {"ANTHROPIC_API_KEY": KEY},
            "hooks": {"SessionEnd": [{"hooks": [{"type": "command", "command": "true"}]}]},
        }))
        .unwrap();
        std::fs::write(self.settings(), &text).unwrap();
        set_mode(&self.settings(), mode);
        for path in [self.claude(), self.settings()] {
            std::os::unix::fs::chown(path, Some(ALICE), Some(ALICE)).unwrap();
        }
        text
    }

    /// A link of ALICE's at `link`, to `target`.
    fn plant(&self, target: &Path, link: &Path) {
        std::os::unix::fs::symlink(target, link).unwrap();
        std::os::unix::fs::lchown(link, Some(ALICE), Some(ALICE)).unwrap();
    }

    /// `liveness hooks VERB claude-code` run by root with ALICE's HOME (and `env`), as
    /// `sudo -E` or a provisioning script runs it.
    fn root_runs(&self, verb: &str, env: &[(&str, &Path)]) -> std::process::Output {
        Command::new(integration_tests::binary("liveness"))
            .args(["hooks", verb, "claude-code"])
            .env("HOME", self.home())
            .env_remove("CLAUDE_CONFIG_DIR")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Owner and permission bits of `path` (not followed).
fn owner_and_mode(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    (meta.uid(), meta.mode() & 0o7777)
}

/// Every entry under `dir` (and `dir`), with its owner, mode and content or link target:
/// what must not change.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, (u32, u32, Vec<u8>)> {
    use std::os::unix::ffi::OsStringExt;
    let mut all = std::collections::BTreeMap::new();
    let mut left = vec![dir.to_owned()];
    while let Some(path) = left.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let content = if meta.is_symlink() {
            std::fs::read_link(&path)
                .unwrap()
                .into_os_string()
                .into_vec()
        } else if meta.is_dir() {
            left.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            Vec::new()
        } else {
            std::fs::read(&path).unwrap()
        };
        let (uid, mode) = owner_and_mode(&path);
        all.insert(path, (uid, mode, content));
    }
    all
}

fn refused_as_a_link(out: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("is a symbolic link (to "),
        "{out:?}"
    );
}

fn installed_once(settings: &Path) -> Value {
    let installed: Value = serde_json::from_slice(&std::fs::read(settings).unwrap())
        .unwrap_or_else(|e| panic!("{settings:?} is not whole JSON: {e}"));
    let starts = installed["hooks"]["SessionStart"].as_array().unwrap();
    assert_eq!(starts.len(), 1, "{installed}");
    assert!(
        starts[0]
            .to_string()
            .contains("hooks claude-code session-start")
    );
    assert_eq!(
        installed["hooks"]["SessionEnd"].as_array().unwrap().len(),
        2
    );
    installed
}

#[test]
fn root_installing_for_a_user_writes_through_none_of_their_planted_links() {
    if !privileged("root_installing_for_a_user_writes_through_none_of_their_planted_links") {
        return;
    }
    let home = Home::new();
    let original = home.with_settings(0o755, 0o640);
    // Every name a writer beside settings.json might use for its temporary files.
    for name in [
        "settings.json.liveness-tmp",
        "settings.json.liveness-backup.liveness-tmp",
        ".settings.json.liveness-tmp",
        "settings.json.tmp",
        "settings.json~",
    ] {
        home.plant(&home.roots_file(), &home.claude().join(name));
    }
    let roots = snapshot(&home.root_only());
    let out = home.root_runs("install", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        snapshot(&home.root_only()),
        roots,
        "root's file is untouched"
    );
    installed_once(&home.settings());
    let out = home.root_runs("uninstall", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(home.settings()).unwrap(), original);
    assert_eq!(
        snapshot(&home.root_only()),
        roots,
        "root's file is untouched"
    );
}

#[test]
fn a_settings_file_or_backup_that_is_a_link_is_refused_and_nothing_changes() {
    if !privileged("a_settings_file_or_backup_that_is_a_link_is_refused_and_nothing_changes") {
        return;
    }
    // settings.json itself a link to a file of root's (valid JSON, 0600).
    let home = Home::new();
    std::fs::create_dir(home.claude()).unwrap();
    std::os::unix::fs::chown(home.claude(), Some(ALICE), Some(ALICE)).unwrap();
    let roots_settings = home.root_only().join("settings.json");
    std::fs::write(&roots_settings, r#"{"model": "root's"}"#).unwrap();
    set_mode(&roots_settings, 0o600);
    home.plant(&roots_settings, &home.settings());
    let (roots, alices) = (snapshot(&home.root_only()), snapshot(&home.claude()));
    for verb in ["install", "uninstall"] {
        refused_as_a_link(&home.root_runs(verb, &[]));
        assert_eq!(snapshot(&home.root_only()), roots, "{verb}");
        assert_eq!(snapshot(&home.claude()), alices, "{verb}");
    }

    // The backup a link to root's file: refused before anything is written.
    let home = Home::new();
    home.with_settings(0o700, 0o600);
    home.plant(&home.roots_file(), &home.backup());
    let (roots, alices) = (snapshot(&home.root_only()), snapshot(&home.claude()));
    refused_as_a_link(&home.root_runs("install", &[]));
    assert_eq!(snapshot(&home.root_only()), roots);
    assert_eq!(snapshot(&home.claude()), alices);
}

#[test]
fn root_installing_for_a_user_leaves_their_files_theirs_with_their_modes() {
    if !privileged("root_installing_for_a_user_leaves_their_files_theirs_with_their_modes") {
        return;
    }
    // No ~/.claude yet: it is made hers, private, and so is the file.
    let home = Home::new();
    let out = home.root_runs("install", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(owner_and_mode(&home.claude()), (ALICE, 0o700));
    assert_eq!(owner_and_mode(&home.settings()), (ALICE, 0o600));
    let out = home.root_runs("uninstall", &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(!home.settings().exists());

    for mode in [0o600, 0o640] {
        let home = Home::new();
        let original = home.with_settings(0o700, mode);
        let out = home.root_runs("install", &[]);
        assert!(out.status.success(), "{out:?}");
        installed_once(&home.settings());
        assert_eq!(owner_and_mode(&home.settings()), (ALICE, mode));
        assert_eq!(owner_and_mode(&home.backup()), (ALICE, mode));
        let out = home.root_runs("uninstall", &[]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(std::fs::read(home.settings()).unwrap(), original);
        assert_eq!(owner_and_mode(&home.settings()), (ALICE, mode));
        let names: Vec<_> = std::fs::read_dir(home.claude())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["settings.json"], "no backup, no temporary file");
    }
}

#[test]
fn a_private_settings_file_is_never_readable_by_another_user_during_installs() {
    if !privileged("a_private_settings_file_is_never_readable_by_another_user_during_installs") {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    let home = Home::new();
    // A directory anyone may list, a file only she may read.
    home.with_settings(0o755, 0o600);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, claude) = (stop.clone(), home.claude());
        std::thread::spawn(move || {
            // This thread only is EVE: the kernel keeps ids per thread.
            rustix::thread::set_thread_groups(&[]).unwrap();
            let eve = rustix::process::Gid::from_raw(EVE);
            rustix::thread::set_thread_res_gid(eve, eve, eve).unwrap();
            let eve = rustix::process::Uid::from_raw(EVE);
            rustix::thread::set_thread_res_uid(eve, eve, eve).unwrap();
            let (mut leaked, mut refused, mut others) = (Vec::new(), 0, 0);
            while !stop.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir(&claude).unwrap() {
                    let name = entry.unwrap().file_name();
                    if name != "settings.json" && name != "settings.json.liveness-backup" {
                        others += 1;
                    }
                    match std::fs::read_to_string(claude.join(&name)) {
                        Ok(text) if text.contains(KEY) => leaked.push(name),
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => refused += 1,
                        Err(_) => {} // renamed or removed meanwhile
                    }
                }
            }
            (leaked, refused, others)
        })
    };
    for _ in 0..150 {
        for verb in ["install", "uninstall"] {
            let out = home.root_runs(verb, &[]);
            assert!(out.status.success(), "{out:?}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (leaked, refused, others) = reader.join().unwrap();
    eprintln!(
        "another user's reads: {refused} refused, {} leaked; temporary names seen {others} times",
        leaked.len()
    );
    assert!(leaked.is_empty(), "read by another user: {leaked:?}");
    assert!(refused > 0, "the reader never ran");
}

#[test]
fn concurrent_installs_of_one_user_all_succeed_and_install_once() {
    if !privileged("concurrent_installs_of_one_user_all_succeed_and_install_once") {
        return;
    }
    let home = Home::new();
    let original = home.with_settings(0o700, 0o600);
    let binaries = integration_tests::BinariesForAnyUser::new();
    for round in 0..5 {
        // Each with a socket of its own, so that each rewrites the file (its hooks name it).
        let installs: Vec<Child> = (0..20)
            .map(|i| {
                use std::os::unix::process::CommandExt;
                Command::new(binaries.path("liveness"))
                    .arg("--socket")
                    .arg(format!("/run/liveness-{round}-{i}.sock"))
                    .args(["hooks", "install", "claude-code", "--settings"])
                    .arg(home.settings())
                    .uid(ALICE)
                    .gid(ALICE)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let failed: Vec<_> = installs
            .into_iter()
            .map(|install| install.wait_with_output().unwrap())
            .filter(|out| !out.status.success())
            .collect();
        assert!(
            failed.is_empty(),
            "round {round}: {} of 20 failed: {failed:?}",
            failed.len()
        );
        installed_once(&home.settings());
        assert_eq!(std::fs::read(home.backup()).unwrap(), original);
        assert_eq!(
            std::fs::read_dir(home.claude()).unwrap().count(),
            2,
            "no temporary file is left"
        );
    }
}

#[test]
fn a_linked_settings_directory_leads_root_nowhere_the_user_cannot_write() {
    if !privileged("a_linked_settings_directory_leads_root_nowhere_the_user_cannot_write") {
        return;
    }
    // ~/.claude a link into root's directory.
    let home = Home::new();
    home.plant(&home.root_only(), &home.claude());
    let roots = snapshot(&home.root_only());
    refused_as_a_link(&home.root_runs("install", &[]));
    assert_eq!(snapshot(&home.root_only()), roots);

    // CLAUDE_CONFIG_DIR through a link of hers on the way: followed as her, so root's
    // directory is as closed to it as to her.
    let home = Home::new();
    std::fs::create_dir(home.root_only().join("cfg")).unwrap();
    home.plant(&home.root_only(), &home.home().join("way"));
    let roots = snapshot(&home.root_only());
    let config = home.home().join("way/cfg");
    let out = home.root_runs("install", &[("CLAUDE_CONFIG_DIR", &config)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("Permission denied"),
        "{out:?}"
    );
    assert_eq!(snapshot(&home.root_only()), roots);
}

#[test]
fn root_acts_with_the_owners_account_or_says_how_to_run_as_them() {
    if !privileged("root_acts_with_the_owners_account_or_says_how_to_run_as_them") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    // A home of `nobody` (65534, group nogroup 65534 in the user database), whose group is
    // one nobody is not in: what root makes there has the account's group.
    let home = Home::new();
    std::os::unix::fs::chown(home.home(), Some(65_534), Some(ALICE)).unwrap();
    let out = home.root_runs("install", &[]);
    assert!(out.status.success(), "{out:?}");
    for path in [home.claude(), home.settings()] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65_534, 65_534), "{path:?}");
    }

    // A uid with no account, owning a home of root's group: no group to act with, so
    // root refuses, and says how to run it as them.
    let home = Home::new();
    std::os::unix::fs::chown(home.home(), Some(ALICE), Some(0)).unwrap();
    let out = home.root_runs("install", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("sudo -u '#{ALICE}' ")),
        "{out:?}"
    );
    assert_eq!(std::fs::read_dir(home.home()).unwrap().count(), 0);
}
