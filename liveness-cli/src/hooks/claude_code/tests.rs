use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{Value, json};

use super::CLAUDE_CODE;
use crate::hooks::{
    Agent, HookCommand, HookEnv, Installed, Uninstalled, backup_path, install, killed, uninstall,
};

fn command() -> HookCommand {
    HookCommand {
        program: "/usr/bin/liveness".into(),
        socket: None,
        start: Vec::new(),
    }
}

/// A user's settings, as they might have written them: keys in their own order, hooks of
/// their own on the events liveness hooks and on others, four-space indents.
const USER_SETTINGS: &str = r#"{
    "model": "opus",
    "hooks": {
        "SessionEnd": [
            {"hooks": [{"type": "command", "command": "~/bin/save-notes.sh", "timeout": 30}]}
        ],
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "check-bash"}]}
        ],
        "SessionStart": [
            {"matcher": "startup", "hooks": [{"type": "command", "command": "echo hello"}]}
        ]
    },
    "permissions": {"allow": ["Bash(ls:*)"]}
}
"#;

fn settings_in(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("settings.json");
    std::fs::write(&path, text).unwrap();
    path
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn install_keeps_every_user_setting_and_hook_and_adds_liveness_s() {
    let dir = tempfile::tempdir().unwrap();
    let path = settings_in(dir.path(), USER_SETTINGS);
    let installed = install(&CLAUDE_CODE, &path, &command()).unwrap();
    assert_eq!(
        installed,
        Installed::Changed {
            backup: Some(backup_path(&path))
        }
    );
    assert_eq!(
        std::fs::read_to_string(backup_path(&path)).unwrap(),
        USER_SETTINGS
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let keys: Vec<usize> = [
        "\"model\"",
        "\"hooks\"",
        "\"SessionEnd\"",
        "\"PreToolUse\"",
        "\"SessionStart\"",
        "\"permissions\"",
    ]
    .iter()
    .map(|key| text.find(key).unwrap())
    .collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "the user's key order is kept:\n{text}"
    );
    let settings = read_json(&path);
    let original: Value = serde_json::from_str(USER_SETTINGS).unwrap();
    assert_eq!(settings["model"], original["model"]);
    assert_eq!(settings["permissions"], original["permissions"]);
    // The user's PreToolUse hook stays first; liveness's declares the tool, in the
    // background, for every tool (no matcher).
    assert_eq!(
        settings["hooks"]["PreToolUse"],
        json!([
            original["hooks"]["PreToolUse"][0],
            {"hooks": [{"type": "command", "command": "/usr/bin/liveness hooks claude-code tool-start", "async": true}]}
        ])
    );
    assert_eq!(
        settings["hooks"]["UserPromptSubmit"],
        json!([{"hooks": [{"type": "command", "command": "/usr/bin/liveness hooks claude-code turn-start"}]}]),
        "the turn's start is declared before the turn runs"
    );
    assert_eq!(
        settings["hooks"]["SessionEnd"],
        json!([
            original["hooks"]["SessionEnd"][0],
            {"hooks": [{"type": "command", "command": "/usr/bin/liveness hooks claude-code session-end"}]}
        ])
    );
    assert_eq!(
        settings["hooks"]["SessionStart"],
        json!([
            original["hooks"]["SessionStart"][0],
            {"hooks": [{"type": "command", "command": "/usr/bin/liveness hooks claude-code session-start"}]}
        ])
    );
}

#[test]
fn installing_twice_changes_no_byte_and_uninstall_restores_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let path = settings_in(dir.path(), USER_SETTINGS);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    install(&CLAUDE_CODE, &path, &command()).unwrap();
    let once = std::fs::read(&path).unwrap();
    assert_eq!(
        install(&CLAUDE_CODE, &path, &command()).unwrap(),
        Installed::Unchanged
    );
    assert_eq!(std::fs::read(&path).unwrap(), once, "byte-identical");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the file's permissions are kept");

    assert_eq!(
        uninstall(&CLAUDE_CODE, &path).unwrap(),
        Uninstalled::Restored
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), USER_SETTINGS);
    assert!(
        !backup_path(&path).exists(),
        "the backup went with the restore"
    );
    assert_eq!(
        uninstall(&CLAUDE_CODE, &path).unwrap(),
        Uninstalled::NotInstalled
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), USER_SETTINGS);
}

#[test]
fn a_new_binary_path_replaces_the_hook_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = settings_in(dir.path(), USER_SETTINGS);
    install(&CLAUDE_CODE, &path, &command()).unwrap();
    let moved = HookCommand {
        program: "/opt/liveness/bin/liveness".into(),
        socket: Some("/run/user/1000/liveness/liveness.sock".into()),
        start: Vec::new(),
    };
    install(&CLAUDE_CODE, &path, &moved).unwrap();
    let settings = read_json(&path);
    let ends = settings["hooks"]["SessionEnd"].as_array().unwrap();
    assert_eq!(ends.len(), 2, "one hook of liveness's, not two: {settings}");
    assert_eq!(
        ends[1]["hooks"][0]["command"],
        "/opt/liveness/bin/liveness --socket /run/user/1000/liveness/liveness.sock hooks claude-code session-end"
    );
    assert_eq!(
        uninstall(&CLAUDE_CODE, &path).unwrap(),
        Uninstalled::Restored
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), USER_SETTINGS);
}

#[test]
fn a_missing_settings_file_is_created_and_removed_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".claude/settings.json");
    assert_eq!(
        install(&CLAUDE_CODE, &path, &command()).unwrap(),
        Installed::Changed { backup: None }
    );
    assert_eq!(
        read_json(&path)["hooks"]["SessionStart"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        uninstall(&CLAUDE_CODE, &path).unwrap(),
        Uninstalled::Removed
    );
    assert!(!path.exists());
}

#[test]
fn uninstall_after_an_edit_keeps_the_edit_and_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let path = settings_in(dir.path(), USER_SETTINGS);
    install(&CLAUDE_CODE, &path, &command()).unwrap();
    let mut edited = read_json(&path);
    edited["theme"] = json!("dark");
    std::fs::write(&path, serde_json::to_vec_pretty(&edited).unwrap()).unwrap();
    assert_eq!(
        uninstall(&CLAUDE_CODE, &path).unwrap(),
        Uninstalled::HooksRemoved {
            backup: Some(backup_path(&path))
        }
    );
    let mut expected: Value = serde_json::from_str(USER_SETTINGS).unwrap();
    expected["theme"] = json!("dark");
    assert_eq!(read_json(&path), expected);
    assert!(backup_path(&path).exists());
}

#[test]
fn settings_liveness_cannot_read_are_left_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    for (text, expected) in [
        ("{\"hooks\": ", "not valid JSON"),
        ("[]", "not a JSON object"),
        ("{\"hooks\": []}", "\"hooks\" is not an object"),
        (
            "{\"hooks\": {\"SessionEnd\": {}}}",
            "\"hooks.SessionEnd\" is not a list",
        ),
    ] {
        let path = settings_in(dir.path(), text);
        let error = install(&CLAUDE_CODE, &path, &command())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(expected) && error.contains(&path.display().to_string()),
            "{text}: {error}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert!(!backup_path(&path).exists());
    }
}

#[test]
fn a_symlinked_settings_file_is_refused_and_names_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = settings_in(dir.path(), USER_SETTINGS);
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for error in [
        install(&CLAUDE_CODE, &link, &command()).unwrap_err(),
        uninstall(&CLAUDE_CODE, &link).unwrap_err(),
    ] {
        let error = error.to_string();
        assert!(
            error.contains(&format!(
                "link.json is a symbolic link (to {})",
                target.display()
            )),
            "{error}"
        );
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), USER_SETTINGS);
    assert!(!backup_path(&link).exists() && !backup_path(&target).exists());
    // Named as itself, the file is edited in its own directory.
    install(&CLAUDE_CODE, &target, &command()).unwrap();
    assert_eq!(
        uninstall(&CLAUDE_CODE, &target).unwrap(),
        Uninstalled::Restored
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), USER_SETTINGS);
}

#[test]
fn the_default_settings_follow_claude_config_dir() {
    let mut env = HookEnv {
        home: Some("/home/u".into()),
        ..HookEnv::default()
    };
    assert_eq!(
        CLAUDE_CODE.user_settings(&env).unwrap(),
        Path::new("/home/u/.claude/settings.json")
    );
    env.vars.insert("CLAUDE_CONFIG_DIR".into(), "/cfg".into());
    assert_eq!(
        CLAUDE_CODE.user_settings(&env).unwrap(),
        Path::new("/cfg/settings.json")
    );
    let files = CLAUDE_CODE.settings_files(&json!({"cwd": "/repo"}), &env);
    assert_eq!(
        files,
        [
            "/cfg/settings.json",
            "/repo/.claude/settings.json",
            "/repo/.claude/settings.local.json",
            "/etc/claude-code/managed-settings.json"
        ]
        .map(std::path::PathBuf::from)
    );
}

fn start_input() -> Value {
    json!({
        "session_id": "abc-123",
        "transcript_path": "/home/u/.claude/projects/repo/abc-123.jsonl",
        "cwd": "/repo",
        "permission_mode": "default",
        "hook_event_name": "SessionStart",
        "source": "startup",
        "model": "some-model"
    })
}

/// The argv of liveness's end-hook wrapper around a user's command.
fn wrapped(user: &[&str]) -> Vec<String> {
    let start = json!({
        "session_id": "abc-123",
        "transcript_path": "/home/u/.claude/projects/repo/abc-123.jsonl",
        "cwd": "/repo",
        "permission_mode": "default"
    });
    let mut argv: Vec<String> = [
        "/usr/bin/liveness",
        "hooks",
        "claude-code",
        "end-hook",
        "--input",
    ]
    .map(str::to_owned)
    .to_vec();
    argv.push(start.to_string());
    argv.push("--".into());
    argv.extend(user.iter().map(|w| (*w).to_owned()));
    argv
}

#[test]
fn session_start_registers_the_users_end_commands_as_end_actions() {
    let user = json!({"hooks": {"SessionEnd": [
        {"hooks": [
            {"type": "command", "command": "~/bin/save-notes.sh", "timeout": 30},
            {"type": "command", "command": "/usr/bin/liveness hooks claude-code session-end"},
            {"type": "prompt", "prompt": "summarize"}
        ]},
        {"matcher": "clear", "hooks": [{"type": "command", "command": "only-on-clear"}]},
        {"matcher": "logout|other", "hooks": [
            {"type": "command", "command": "/usr/bin/upload", "args": ["--all", "it's"]},
            {"type": "command", "command": "echo $HOME", "shell": "bash"}
        ]}
    ]}});
    let project = json!({"hooks": {"SessionEnd": [
        {"matcher": "*", "hooks": [{"type": "command", "command": "~/bin/save-notes.sh", "timeout": 30}]}
    ]}});
    let env = HookEnv::default();
    let plan = CLAUDE_CODE
        .session_start(&start_input(), &[user, project], &env, &command())
        .unwrap();
    assert_eq!(plan.session, "abc-123");
    assert_eq!(plan.labels["agent"], "claude-code");
    let argvs: Vec<&Vec<String>> = plan.actions.iter().map(|a| &a.argv).collect();
    assert_eq!(
        argvs,
        [
            &wrapped(&["sh", "-c", "~/bin/save-notes.sh"]),
            &wrapped(&["/usr/bin/upload", "--all", "it's"]),
            &wrapped(&["bash", "-c", "echo $HOME"]),
        ],
        "liveness's own hook, the prompt hook, the clear-only hook and the duplicate are not actions"
    );
    assert_eq!(plan.actions[0].timeout_ms, Some(30_000));
    assert_eq!(
        plan.actions[1].timeout_ms, None,
        "liveness's default, not the agent's 1.5 s"
    );
    for action in &plan.actions {
        assert_eq!(action.cwd.as_deref(), Some("/repo"));
        assert_eq!(action.env, ["CLAUDE_PROJECT_DIR=/repo"]);
        action.validate().unwrap();
    }
    assert_eq!(plan.notes.len(), 2, "{:?}", plan.notes);
}

#[test]
fn session_start_registers_no_end_command_when_hooks_are_disabled() {
    let settings = json!({"disableAllHooks": true, "hooks": {"SessionEnd": [
        {"hooks": [{"type": "command", "command": "cleanup"}]}
    ]}});
    let plan = CLAUDE_CODE
        .session_start(&start_input(), &[settings], &HookEnv::default(), &command())
        .unwrap();
    assert!(plan.actions.is_empty());
    assert!(plan.notes[0].contains("disableAllHooks"));
}

#[test]
fn a_hook_input_without_a_session_id_is_refused() {
    for input in [
        json!({}),
        json!({"session_id": ""}),
        json!({"session_id": 7}),
    ] {
        let error = CLAUDE_CODE
            .session_start(&input, &[], &HookEnv::default(), &command())
            .unwrap_err();
        assert!(error.to_string().contains("no session_id"), "{error}");
        assert!(CLAUDE_CODE.session_end(&input).is_err());
    }
    assert_eq!(
        CLAUDE_CODE
            .session_end(&json!({"session_id": "abc-123", "reason": "logout"}))
            .unwrap(),
        "abc-123"
    );
}

#[test]
fn an_end_command_run_by_liveness_gets_the_session_end_schema_and_the_facts() {
    let facts = killed("abc-123", "claude");
    let input = CLAUDE_CODE.end_input(&start_input(), &facts);
    assert_eq!(
        input,
        json!({
            "session_id": "abc-123",
            "transcript_path": "/home/u/.claude/projects/repo/abc-123.jsonl",
            "cwd": "/repo",
            "permission_mode": "default",
            "hook_event_name": "SessionEnd",
            "reason": "other",
            "liveness": serde_json::to_value(&facts).unwrap()
        })
    );
}
