//! Cursor's hook protocol (the agent CLI, `cursor-agent`, and the editor), as Cursor's hooks
//! page describes it: `~/.cursor/hooks.json` (and a project's `.cursor/hooks.json`) holds
//! `{"version": 1, "hooks": {"<event>": [{"command": "...", "timeout": SECONDS}]}}`, and
//! one event name Cursor does not know voids the whole file: `install` refuses a file with
//! one, and writes none. The input has `session_id`, `conversation_id`,
//! `workspace_roots`, `hook_event_name`, and at `sessionEnd` `reason` (`completed`,
//! `aborted`, `error`, `window_close`, `user_close`) and `duration_ms`. Not tried against
//! a real Cursor here: it is not published on a package registry.

use std::path::PathBuf;

use serde_json::Value;

use super::Activity::{ToolEnd, ToolStart, TurnEnd, TurnStart};
use super::HookEnv;
use super::command_hooks::{ActivityHook, CommandHooks, Layout, cwd, in_home};

/// Cursor.
pub static CURSOR: CommandHooks = CommandHooks {
    name: "cursor",
    start: "sessionStart",
    end: Some("sessionEnd"),
    layout: Layout::Flat,
    command: "command",
    typed: false,
    timeout: Some(("timeout", 1000)),
    version: Some(1),
    events: Some(&[
        "sessionStart",
        "sessionEnd",
        "beforeSubmitPrompt",
        "beforeShellExecution",
        "afterShellExecution",
        "beforeMCPExecution",
        "afterMCPExecution",
        "beforeReadFile",
        "afterFileEdit",
        "afterAgentResponse",
        "afterAgentThought",
        "preToolUse",
        "postToolUse",
        "postToolUseFailure",
        "subagentStart",
        "subagentStop",
        "preCompact",
        "stop",
        "beforeTabFileRead",
        "afterTabFileEdit",
    ]),
    session_key: "session_id",
    alt_session_key: Some("conversation_id"),
    activity: &[
        ActivityHook::waited("beforeSubmitPrompt", TurnStart),
        ActivityHook::waited("stop", TurnEnd),
        ActivityHook::waited("preToolUse", ToolStart),
        ActivityHook::waited("postToolUse", ToolEnd),
        ActivityHook::waited("postToolUseFailure", ToolEnd),
    ],
    tool_key: "tool_name",
    event_key: Some("hook_event_name"),
    start_fields: &[
        "session_id",
        "conversation_id",
        "workspace_roots",
        "transcript_path",
        "cwd",
    ],
    reason: "aborted",
    disable_key: None,
    env: &[],
    npm: None,
    trust_in_config: false,
    user_settings: |env| in_home(env, ".cursor/hooks.json"),
    settings_files,
    action_env: |_: &Value, _: &HookEnv| Vec::new(),
};

fn settings_files(agent: &CommandHooks, input: &Value, env: &HookEnv) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (agent.user_settings)(env).into_iter().collect();
    files.extend(cwd(input).map(|project| project.join(".cursor/hooks.json")));
    files
}
