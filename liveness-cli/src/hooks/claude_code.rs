//! Claude Code's hook protocol.
//!
//! Followed as the Claude Code hooks reference (code.claude.com/docs/en/hooks) and
//! settings page (code.claude.com/docs/en/settings) describe it, read on 2026-11-26:
//!
//! - Settings files: user `~/.claude/settings.json` (`$CLAUDE_CONFIG_DIR/settings.json`
//!   when set), project `<project>/.claude/settings.json`, local
//!   `<project>/.claude/settings.local.json`, managed `/etc/claude-code/managed-settings.json`.
//!   Hooks of every file run; `"disableAllHooks": true` turns them off.
//! - `"hooks": {"<Event>": [{"matcher": "...", "hooks": [{"type": "command", "command":
//!   "...", "args": [...], "timeout": SECONDS, "shell": "..."}]}]}`. A command hook runs
//!   `sh -c COMMAND` (shell form), or `COMMAND ARGS...` without a shell when `args` is set
//!   (exec form); `timeout` is in seconds. For `SessionEnd` the matcher is matched against
//!   the end reason; an absent, empty or `*` matcher matches every one.
//! - Hook input on stdin, common fields `session_id`, `transcript_path`, `cwd`,
//!   `permission_mode`, `hook_event_name`; `SessionStart` adds `source` (`startup`,
//!   `resume`, `clear`, `compact`); `SessionEnd` adds `reason` (`clear`, `logout`,
//!   `prompt_input_exit`, `bypass_permissions_disabled`, `other`).
//! - Hooks get `CLAUDE_PROJECT_DIR`. `SessionEnd` hooks share a budget of 1.5 s unless
//!   they set a longer `timeout` (at most 60 s), and none runs on a crash, a SIGKILL,
//!   `claude -p` or a closed terminal: which is what liveness makes up for.
//!
//! When livenessd runs an end command, its input is the `SessionEnd` schema with `reason`
//! `other` (the agent could not say), plus a `liveness` object: the end facts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use liveness_common::action::{ActionSpec, EndFacts, MAX_ACTION_TIMEOUT_MS, MAX_ACTIONS};

use super::json::{Json, Object};
use super::{Agent, HookCommand, HookEnv, HookError, StartPlan, is_hook_command};

/// Claude Code.
#[derive(Debug)]
pub struct ClaudeCode;

const NAME: &str = "claude-code";
/// The events liveness hooks, and the hook each runs.
const HOOKS: [(&str, &str); 2] = [
    ("SessionStart", "session-start"),
    ("SessionEnd", "session-end"),
];
/// The end reason given to the end commands livenessd runs.
const REASON: &str = "other";
/// The hook input fields common to every event, kept from the session's start.
const START_FIELDS: [&str; 4] = ["session_id", "transcript_path", "cwd", "permission_mode"];
/// The environment variables the hooks read.
pub const ENV: [&str; 2] = ["CLAUDE_CONFIG_DIR", "CLAUDE_PROJECT_DIR"];

impl Agent for ClaudeCode {
    fn name(&self) -> &'static str {
        NAME
    }

    fn user_settings(&self, env: &HookEnv) -> Result<PathBuf, HookError> {
        match env.var("CLAUDE_CONFIG_DIR") {
            Some(dir) => Ok(PathBuf::from(dir).join("settings.json")),
            None => Ok(env
                .home
                .as_ref()
                .ok_or(HookError::NoHome)?
                .join(".claude/settings.json")),
        }
    }

    fn add_hooks(&self, settings: &mut Object, command: &HookCommand) -> Result<(), HookError> {
        if settings.get("hooks").is_none() {
            settings.insert("hooks", Json::Object(Object::default()));
        }
        let hooks = object(settings.get_mut("hooks"), "hooks")?;
        for (event, hook) in HOOKS {
            if hooks.get(event).is_none() {
                hooks.insert(event, Json::Array(Vec::new()));
            }
            let groups = array(hooks.get_mut(event), event)?;
            let ours = Json::from_value(&json!({
                "hooks": [{"type": "command", "command": command.shell_line(NAME, hook)}]
            }));
            match groups.iter().position(|group| is_ours(group, hook)) {
                Some(at) => groups[at] = ours,
                None => groups.push(ours),
            }
        }
        Ok(())
    }

    fn remove_hooks(&self, settings: &mut Object) -> Result<(), HookError> {
        let Some(hooks) = settings.get_mut("hooks") else {
            return Ok(());
        };
        let hooks = object(Some(hooks), "hooks")?;
        let mut removed = false;
        for (event, hook) in HOOKS {
            let Some(groups) = hooks.get_mut(event) else {
                continue;
            };
            let groups = array(Some(groups), event)?;
            let before = groups.len();
            groups.retain(|group| !is_ours(group, hook));
            removed |= groups.len() < before;
            // Only a list that liveness's removal emptied goes: the user's own empty one stays.
            if groups.is_empty() && before > 0 {
                hooks.remove(event);
            }
        }
        if removed && hooks.is_empty() {
            settings.remove("hooks");
        }
        Ok(())
    }

    fn settings_files(&self, input: &Value, env: &HookEnv) -> Vec<PathBuf> {
        let mut files = Vec::new();
        if let Ok(user) = self.user_settings(env) {
            files.push(user);
        }
        if let Some(project) = project_dir(input, env) {
            files.push(project.join(".claude/settings.json"));
            files.push(project.join(".claude/settings.local.json"));
        }
        files.push(PathBuf::from("/etc/claude-code/managed-settings.json"));
        files
    }

    fn session_start(
        &self,
        input: &Value,
        settings: &[Value],
        env: &HookEnv,
        command: &HookCommand,
    ) -> Result<StartPlan, HookError> {
        let session = session_id(input)?;
        let mut notes = Vec::new();
        let start = start_fields(input);
        let project = project_dir(input, env);
        let cwd = input["cwd"].as_str().filter(|cwd| cwd.starts_with('/'));
        let mut actions: Vec<ActionSpec> = Vec::new();
        for (user_argv, timeout_ms) in end_commands(settings, &mut notes) {
            let mut argv = command.argv(NAME, "end-hook");
            argv.extend(["--input".to_owned(), start.to_string(), "--".to_owned()]);
            argv.extend(user_argv);
            let action = ActionSpec {
                argv,
                env: project
                    .iter()
                    .map(|dir| format!("CLAUDE_PROJECT_DIR={}", dir.display()))
                    .collect(),
                timeout_ms,
                cwd: cwd.map(str::to_owned),
            };
            if actions.contains(&action) {
                continue; // the same command in two files runs once, as in Claude Code
            }
            match action.validate() {
                Ok(()) if actions.len() < MAX_ACTIONS => actions.push(action),
                Ok(()) => notes.push(format!(
                    "more than {MAX_ACTIONS} SessionEnd commands: the rest are skipped"
                )),
                Err(e) => notes.push(format!(
                    "a SessionEnd command cannot be an end action ({e}): skipped"
                )),
            }
        }
        Ok(StartPlan {
            session,
            labels: BTreeMap::from([("agent".to_owned(), NAME.to_owned())]),
            actions,
            notes,
        })
    }

    fn session_end(&self, input: &Value) -> Result<String, HookError> {
        session_id(input)
    }

    fn end_input(&self, start: &Value, facts: &EndFacts) -> Value {
        let mut input = start_fields(start);
        input["session_id"] = json!(facts.session);
        input["hook_event_name"] = json!("SessionEnd");
        input["reason"] = json!(REASON);
        input["liveness"] = serde_json::to_value(facts).unwrap_or(Value::Null);
        input
    }
}

/// The user's `SessionEnd` commands that Claude Code would run for the reason liveness
/// reports, as argvs with their timeouts; what is left out is noted.
fn end_commands(settings: &[Value], notes: &mut Vec<String>) -> Vec<(Vec<String>, Option<u64>)> {
    if settings.iter().any(|s| s["disableAllHooks"] == true) {
        notes.push("disableAllHooks is set: no SessionEnd command is registered".into());
        return Vec::new();
    }
    let mut commands = Vec::new();
    for group in settings
        .iter()
        .flat_map(|s| list(&s["hooks"]["SessionEnd"]))
    {
        if !matches_reason(&group["matcher"]) {
            notes.push(format!(
                "SessionEnd hooks with matcher {} are not run by liveness, which ends sessions with reason \"{REASON}\"",
                group["matcher"]
            ));
            continue;
        }
        for hook in list(&group["hooks"]) {
            match user_argv(hook) {
                Some(argv) => commands.push((
                    argv,
                    hook["timeout"]
                        .as_f64()
                        .map(|seconds| ((seconds * 1000.0) as u64).clamp(1, MAX_ACTION_TIMEOUT_MS)),
                )),
                None if hook["type"] != "command" => notes.push(format!(
                    "a SessionEnd hook of type {} is not a command: skipped",
                    hook["type"]
                )),
                None => {}
            }
        }
    }
    commands
}

/// Whether a hook group is the one liveness installs for `hook`.
fn is_ours(group: &Json, hook: &str) -> bool {
    let hooks = group.to_value();
    let hooks = list(&hooks["hooks"]);
    !hooks.is_empty()
        && hooks.iter().all(|h| {
            h["type"] == "command"
                && h["command"]
                    .as_str()
                    .is_some_and(|line| is_hook_command(line, NAME, hook))
        })
}

/// The argv of a user's command hook, as Claude Code would run it; `None` for another kind
/// of hook and for liveness's own.
fn user_argv(hook: &Value) -> Option<Vec<String>> {
    let line = hook["command"]
        .as_str()
        .filter(|_| hook["type"] == "command")?;
    if HOOKS
        .iter()
        .any(|(_, ours)| is_hook_command(line, NAME, ours))
    {
        return None;
    }
    if let Some(args) = hook["args"].as_array() {
        let args: Option<Vec<String>> =
            args.iter().map(|a| a.as_str().map(str::to_owned)).collect();
        let mut argv = vec![line.to_owned()];
        argv.extend(args?);
        return Some(argv);
    }
    let shell = hook["shell"].as_str().unwrap_or("sh");
    Some(vec![shell.to_owned(), "-c".to_owned(), line.to_owned()])
}

/// Whether a `SessionEnd` matcher selects the reason liveness reports: absent, empty, `*`,
/// `.*`, or alternatives (`a|b`) naming it. Other patterns are not interpreted.
fn matches_reason(matcher: &Value) -> bool {
    match matcher {
        Value::Null => true,
        Value::String(m) => {
            matches!(m.as_str(), "" | "*" | ".*") || m.split('|').any(|alt| alt.trim() == REASON)
        }
        _ => false,
    }
}

fn session_id(input: &Value) -> Result<String, HookError> {
    input["session_id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| HookError::Input("no session_id in the hook's JSON on stdin".into()))
}

/// The common fields of a hook input, as given.
fn start_fields(input: &Value) -> Value {
    Value::Object(
        START_FIELDS
            .iter()
            .filter_map(|field| Some(((*field).to_owned(), input.get(*field)?.clone())))
            .collect(),
    )
}

fn project_dir(input: &Value, env: &HookEnv) -> Option<PathBuf> {
    env.var("CLAUDE_PROJECT_DIR")
        .or_else(|| input["cwd"].as_str())
        .filter(|dir| dir.starts_with('/'))
        .map(PathBuf::from)
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn object<'a>(value: Option<&'a mut Json>, name: &str) -> Result<&'a mut Object, HookError> {
    match value {
        Some(Json::Object(object)) => Ok(object),
        _ => Err(shape(format!("\"{name}\" is not an object"))),
    }
}

fn array<'a>(value: Option<&'a mut Json>, name: &str) -> Result<&'a mut Vec<Json>, HookError> {
    match value {
        Some(Json::Array(items)) => Ok(items),
        _ => Err(shape(format!("\"hooks.{name}\" is not a list"))),
    }
}

/// A settings shape error; `install` and `uninstall` name the file.
fn shape(what: String) -> HookError {
    HookError::Settings {
        path: PathBuf::new(),
        what,
    }
}

#[cfg(test)]
mod tests;
