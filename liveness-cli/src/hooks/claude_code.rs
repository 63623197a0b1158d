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
//! - Hooks get `CLAUDE_PROJECT_DIR` (and `CLAUDE_CODE_SESSION_ID`). `SessionEnd` hooks
//!   share a budget of 1.5 s unless they set a longer `timeout` (at most 60 s). Claude Code
//!   2.1.197 runs them for `claude -p`, SIGINT, SIGTERM and a closed terminal, and none on
//!   a SIGKILL, a crash or the OOM killer: which is what liveness makes up for.
//!
//! When livenessd runs an end command, its input is the `SessionEnd` schema with `reason`
//! `other` (the agent could not say), plus a `liveness` object: the end facts.

use std::path::PathBuf;

use serde_json::Value;

use super::Activity::{ToolEnd, ToolStart, TurnEnd, TurnStart};
use super::HookEnv;
use super::command_hooks::{ActivityHook, CommandHooks, Layout, cwd, in_home};

/// Claude Code.
pub static CLAUDE_CODE: CommandHooks = CommandHooks {
    name: "claude-code",
    start: "SessionStart",
    end: Some("SessionEnd"),
    layout: Layout::Grouped,
    command: "command",
    typed: true,
    timeout: Some(("timeout", 1000)),
    version: None,
    events: None,
    session_key: "session_id",
    alt_session_key: None,
    activity: &[
        ActivityHook::waited("UserPromptSubmit", TurnStart),
        ActivityHook::background("Stop", TurnEnd),
        ActivityHook::background("StopFailure", TurnEnd),
        ActivityHook::background("PreToolUse", ToolStart),
        ActivityHook::background("PostToolUse", ToolEnd),
        ActivityHook::background("PostToolUseFailure", ToolEnd),
    ],
    tool_key: "tool_name",
    event_key: Some("hook_event_name"),
    start_fields: &[
        "session_id",
        "transcript_path",
        "cwd",
        "permission_mode",
        "prompt_id",
    ],
    reason: "other",
    disable_key: Some("disableAllHooks"),
    env: &[
        "CLAUDE_CONFIG_DIR",
        "CLAUDE_PROJECT_DIR",
        "CLAUDE_CODE_SESSION_ID",
    ],
    npm: Some(("claude", "@anthropic-ai/claude-code")),
    trust_in_config: false,
    user_settings,
    settings_files,
    action_env,
};

fn user_settings(env: &HookEnv) -> Result<PathBuf, super::HookError> {
    match env.var("CLAUDE_CONFIG_DIR") {
        Some(dir) => Ok(PathBuf::from(dir).join("settings.json")),
        None => in_home(env, ".claude/settings.json"),
    }
}

fn settings_files(agent: &CommandHooks, input: &Value, env: &HookEnv) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (agent.user_settings)(env).into_iter().collect();
    if let Some(project) = project_dir(input, env) {
        files.push(project.join(".claude/settings.json"));
        files.push(project.join(".claude/settings.local.json"));
    }
    files.push(PathBuf::from("/etc/claude-code/managed-settings.json"));
    files
}

fn action_env(input: &Value, env: &HookEnv) -> Vec<String> {
    project_dir(input, env)
        .iter()
        .map(|dir| format!("CLAUDE_PROJECT_DIR={}", dir.display()))
        .collect()
}

fn project_dir(input: &Value, env: &HookEnv) -> Option<PathBuf> {
    env.var("CLAUDE_PROJECT_DIR")
        .filter(|dir| dir.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| cwd(input))
}

#[cfg(test)]
mod tests;
