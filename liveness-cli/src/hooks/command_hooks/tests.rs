use serde_json::{Value, json};

use super::CommandHooks;
use crate::hooks::codex::CODEX;
use crate::hooks::copilot::COPILOT;
use crate::hooks::cursor::CURSOR;
use crate::hooks::gemini::GEMINI;
use crate::hooks::json::{Json, Object};
use crate::hooks::{Agent, HookCommand, HookEnv, killed};

fn command() -> HookCommand {
    HookCommand {
        program: "/usr/bin/liveness".into(),
        socket: None,
        start: Vec::new(),
    }
}

fn object(value: Value) -> Object {
    match Json::from_value(&value) {
        Json::Object(object) => object,
        _ => unreachable!(),
    }
}

fn plan_timeouts(agent: &CommandHooks, settings: Value, input: Value) -> Vec<Option<u64>> {
    let plan = agent
        .session_start(&input, &[settings], &HookEnv::default(), &command())
        .unwrap();
    plan.actions.iter().map(|a| a.timeout_ms).collect()
}

#[test]
fn each_agent_s_timeout_unit_becomes_milliseconds() {
    let grouped = |timeout: u64| {
        json!({"hooks": {"SessionEnd": [{"hooks": [
            {"type": "command", "command": "notes", "timeout": timeout}
        ]}]}})
    };
    let input = json!({"session_id": "s", "cwd": "/repo"});
    assert_eq!(
        plan_timeouts(&CODEX, grouped(30), input.clone()),
        [Some(30_000)]
    );
    assert_eq!(
        plan_timeouts(&GEMINI, grouped(30_000), input.clone()),
        [Some(30_000)]
    );
    let copilot = json!({"version": 1, "hooks": {"sessionEnd": [
        {"type": "command", "bash": "notes", "timeoutSec": 30}
    ]}});
    assert_eq!(
        plan_timeouts(&COPILOT, copilot, json!({"sessionId": "s"})),
        [Some(30_000)]
    );
}

#[test]
fn liveness_s_own_hooks_are_not_end_commands_and_user_s_are_wrapped() {
    let mut settings = object(json!({"version": 1, "hooks": {
        "sessionEnd": [{"command": "notify-end"}]
    }}));
    CURSOR.add_hooks(&mut settings, &command()).unwrap();
    let settings = Json::Object(settings).to_value();
    let input = json!({"session_id": "s", "workspace_roots": ["/repo"], "model": "m"});
    let plan = CURSOR
        .session_start(&input, &[settings], &HookEnv::default(), &command())
        .unwrap();
    assert_eq!(plan.session, "s");
    assert_eq!(plan.labels["agent"], "cursor");
    assert_eq!(plan.actions.len(), 1, "{plan:?}");
    let argv = &plan.actions[0].argv;
    assert_eq!(
        argv[..4],
        ["/usr/bin/liveness", "hooks", "cursor", "end-hook"]
    );
    let start: Value = serde_json::from_str(&argv[5]).unwrap();
    assert_eq!(
        start,
        json!({"session_id": "s", "workspace_roots": ["/repo"]})
    );
    assert_eq!(argv[6..], ["--", "sh", "-c", "notify-end"]);
}

#[test]
fn files_an_agent_would_reject_are_refused() {
    let refused = |agent: &CommandHooks, value: Value| {
        let mut settings = object(value);
        let error = agent.add_hooks(&mut settings, &command()).unwrap_err();
        error.to_string()
    };
    let unknown = refused(
        &CURSOR,
        json!({"version": 1, "hooks": {"onSave": [{"command": "x"}]}}),
    );
    assert!(
        unknown.contains("\"hooks.onSave\" is not an event cursor knows"),
        "{unknown}"
    );
    let version = refused(&COPILOT, json!({"version": 2}));
    assert!(version.contains("\"version\" is 2"), "{version}");
    let list = refused(&GEMINI, json!({"hooks": {"SessionEnd": {}}}));
    assert!(
        list.contains("\"hooks.SessionEnd\" is not a list"),
        "{list}"
    );
}

#[test]
fn removing_the_hooks_of_liveness_s_own_file_leaves_nothing() {
    for agent in [&COPILOT, &CURSOR, &CODEX, &GEMINI] {
        let mut settings = Object::default();
        agent.add_hooks(&mut settings, &command()).unwrap();
        assert!(!settings.is_empty());
        agent.remove_hooks(&mut settings).unwrap();
        assert!(settings.is_empty(), "{}: {settings:?}", agent.name);
    }
    // The user's own version stays when a hook of theirs does.
    let mut settings = object(json!({"version": 1, "hooks": {"stop": [{"command": "x"}]}}));
    CURSOR.add_hooks(&mut settings, &command()).unwrap();
    CURSOR.remove_hooks(&mut settings).unwrap();
    assert_eq!(
        Json::Object(settings).to_value(),
        json!({"version": 1, "hooks": {"stop": [{"command": "x"}]}})
    );
}

#[test]
fn the_end_input_is_in_each_agent_s_own_schema() {
    let facts = killed("s-1", "copilot");
    let liveness = serde_json::to_value(&facts).unwrap();
    let copilot = COPILOT.end_input(
        &json!({"sessionId": "s-1", "cwd": "/repo", "source": "new", "initialPrompt": "hi"}),
        &facts,
    );
    assert_eq!(
        copilot,
        json!({"sessionId": "s-1", "cwd": "/repo", "reason": "abort", "liveness": liveness})
    );
    let gemini = GEMINI.end_input(
        &json!({"session_id": "s-1", "cwd": "/repo", "transcript_path": "/t", "timestamp": "x"}),
        &facts,
    );
    assert_eq!(
        gemini,
        json!({"session_id": "s-1", "cwd": "/repo", "transcript_path": "/t",
               "hook_event_name": "SessionEnd", "reason": "other", "liveness": liveness})
    );
}

#[test]
fn gemini_s_end_commands_get_the_variables_gemini_gives_its_hooks() {
    let settings = json!({"hooks": {"SessionEnd": [{"hooks": [
        {"type": "command", "command": "notes"}
    ]}]}});
    let input = json!({"session_id": "g-1", "cwd": "/repo"});
    let plan = GEMINI
        .session_start(&input, &[settings], &HookEnv::default(), &command())
        .unwrap();
    assert_eq!(
        plan.actions[0].env,
        [
            "GEMINI_PROJECT_DIR=/repo",
            "GEMINI_CWD=/repo",
            "CLAUDE_PROJECT_DIR=/repo",
            "GEMINI_SESSION_ID=g-1"
        ]
    );
    assert_eq!(plan.actions[0].cwd.as_deref(), Some("/repo"));
}

#[test]
fn the_end_commands_get_what_they_need_of_the_agent_s_environment_and_no_more() {
    let settings = json!({"hooks": {"SessionEnd": [{"hooks": [
        {"type": "command", "command": "notify-end"}
    ]}]}});
    let vars = [
        ("PATH", "/home/a/.local/bin:/usr/bin"),
        ("HOME", "/home/a/agent-home"),
        ("LD_PRELOAD", "/tmp/evil.so"),
        ("CLAUDE_CODE_SESSION_ID", "c-1"),
        ("CLAUDE_PROJECT_DIR", "/elsewhere"),
        ("DISPLAY", &"x".repeat(super::super::MAX_REPLAYED_BYTES)),
    ];
    let env = HookEnv {
        home: Some("/home/a/agent-home".into()),
        vars: vars
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
    };
    let input = json!({"session_id": "c-1", "cwd": "/repo", "prompt_id": "p-7"});
    let plan = crate::hooks::claude_code::CLAUDE_CODE
        .session_start(&input, &[settings], &env, &command())
        .unwrap();
    // Only the named variables pass; the agent's own project directory, as it gives it to
    // its hooks, once; one too long to fit an end action is left out, and said so.
    assert_eq!(
        plan.actions[0].env,
        [
            "PATH=/home/a/.local/bin:/usr/bin",
            "HOME=/home/a/agent-home",
            "CLAUDE_CODE_SESSION_ID=c-1",
            "CLAUDE_PROJECT_DIR=/elsewhere",
        ]
    );
    assert!(
        plan.notes
            .iter()
            .any(|note| note.starts_with("DISPLAY is ")),
        "{:?}",
        plan.notes
    );
    plan.actions[0].validate().unwrap();
    let start = plan.actions[0]
        .argv
        .iter()
        .skip_while(|arg| *arg != "--input")
        .nth(1)
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(start).unwrap()["prompt_id"],
        "p-7"
    );
}

#[test]
fn each_agent_s_activity_input_becomes_a_declaration_on_its_session() {
    use crate::hooks::Activity;
    use liveness_common::activity::TurnMark;
    let touch = GEMINI
        .declaration(
            Activity::ToolStart,
            &json!({"session_id": "g-1", "tool_name": "run_shell_command"}),
        )
        .unwrap();
    assert_eq!(
        (touch.session.as_str(), touch.tool.as_deref()),
        ("g-1", Some("run_shell_command"))
    );
    let touch = COPILOT
        .declaration(
            Activity::ToolStart,
            &json!({"sessionId": "p-1", "toolName": "bash"}),
        )
        .unwrap();
    assert_eq!(touch.tool.as_deref(), Some("bash"));
    // Cursor's prompt and tool events name the conversation, which is the session.
    let touch = CURSOR
        .declaration(Activity::TurnStart, &json!({"conversation_id": "cu-1"}))
        .unwrap();
    assert_eq!(
        (touch.session.as_str(), touch.turn),
        ("cu-1", Some(TurnMark::Start))
    );
    let touch = CODEX
        .declaration(Activity::ToolEnd, &json!({"session_id": "x-1"}))
        .unwrap();
    assert!(touch.tool_end && touch.tool.is_none() && touch.turn.is_none());
    assert!(
        CODEX
            .declaration(Activity::TurnEnd, &json!({"cwd": "/"}))
            .is_err()
    );
    // Kiro 2.x's `stop` ends a turn, on the session its hook named after the agent.
    let touch = crate::hooks::kiro::Kiro
        .declaration(
            Activity::TurnEnd,
            &json!({"hook_event_name": "stop", "session_id": "kiro~7-9"}),
        )
        .unwrap();
    assert_eq!(
        (touch.session.as_str(), touch.turn),
        ("kiro~7-9", Some(TurnMark::End))
    );
}
