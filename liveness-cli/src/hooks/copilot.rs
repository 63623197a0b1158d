//! Copilot CLI's hook protocol, as Copilot CLI 1.0.102 (`@github/copilot`) has it: every
//! `~/.copilot/hooks/*.json` holds `{"version": 1, "hooks": {"<event>": [{"type":
//! "command", "bash": "...", "timeoutSec": SECONDS}]}}` (camelCase events: `sessionStart`,
//! `sessionEnd`, `userPromptSubmitted`, `preToolUse`, ...). liveness writes a file of its
//! own there, `liveness.json`, and reads the user's end commands from the others. The
//! input is camelCase: `sessionId`, `timestamp`, `cwd`, and `source` (`new`, `startup`,
//! `resume`) or `reason` (`complete`, `error`, `abort`, `timeout`, `user_exit`). Only the
//! first `sessionEnd` hook is run by Copilot on SIGINT and SIGTERM, none on SIGKILL.

use std::path::PathBuf;

use serde_json::Value;

use super::Activity::{ToolEnd, ToolStart, TurnEnd, TurnStart};
use super::HookEnv;
use super::command_hooks::{ActivityHook, CommandHooks, Layout, in_home};

/// Copilot CLI.
pub static COPILOT: CommandHooks = CommandHooks {
    name: "copilot",
    start: "sessionStart",
    end: Some("sessionEnd"),
    layout: Layout::Flat,
    command: "bash",
    typed: true,
    timeout: Some(("timeoutSec", 1000)),
    version: Some(1),
    events: None,
    session_key: "sessionId",
    alt_session_key: None,
    activity: &[
        ActivityHook::waited("userPromptSubmitted", TurnStart),
        ActivityHook::waited("agentStop", TurnEnd),
        ActivityHook::waited("preToolUse", ToolStart),
        ActivityHook::waited("postToolUse", ToolEnd),
    ],
    tool_key: "toolName",
    event_key: None,
    start_fields: &["sessionId", "cwd"],
    reason: "abort",
    disable_key: None,
    env: &[],
    npm: Some(("copilot", "@github/copilot")),
    trust_in_config: false,
    user_settings: |env| in_home(env, ".copilot/hooks/liveness.json"),
    settings_files,
    action_env: |_: &Value, _: &HookEnv| Vec::new(),
};

/// The other files of the hooks directory, in name order.
fn settings_files(agent: &CommandHooks, _: &Value, env: &HookEnv) -> Vec<PathBuf> {
    let Ok(ours) = (agent.user_settings)(env) else {
        return Vec::new();
    };
    let Some(Ok(entries)) = ours.parent().map(std::fs::read_dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json") && *path != ours)
        .collect();
    files.sort();
    files
}
