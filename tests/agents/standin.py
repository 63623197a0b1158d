#!/usr/bin/python3
"""A stand-in for Claude Code (its activity events), Codex, Gemini CLI, Copilot CLI,
Cursor's agent and Kiro CLI, chosen by the name it is run under (claude, codex, gemini,
copilot, cursor-agent, kiro-cli, as the real ones; Kiro 2.x's agent hooks with
$STANDIN_KIRO_AGENT set), for the adapters' tests. It follows each agent's hook protocol as
liveness-cli/src/hooks/AGENT.rs records it: reads the agent's hook files from $HOME (and
the project's), runs every session-start command hook with `sh -c` and the agent's own
hook input on stdin, prints "ready", then reads lines on stdin: "prompt", "tool NAME_JSON",
"tool-end" and "stop" run the hooks of a turn's and a tool's start and end (then print "ok");
"exit" runs the end hooks
(reason: the agent's own for a user's exit) and exits 0; "exit-twice" runs them twice (as
Gemini CLI is reported to). Killed, it runs nothing, as the real agents. A start hook that
exits non-zero ends a Kiro session (exit 1), as Kiro does.

Usage: AGENT SESSION_ID CWD, or `standin.py --trust HOME` to trust every hook of the user's
Codex hooks file (Codex runs only the hooks its config.toml trusts, and so does its stand-in).
"""

import datetime
import glob
import hashlib
import json
import os
import subprocess
import sys
import tomllib

HOME = os.environ["HOME"]


def read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def grouped(files, event):
    """Claude-style files: hooks.EVENT[].hooks[] with type command."""
    found = []
    for settings in filter(None, map(read, files)):
        for group in settings.get("hooks", {}).get(event, []):
            for hook in group.get("hooks", []):
                if hook.get("type") == "command" and hook["command"] not in found:
                    found.append(hook["command"])
    return found


def flat(files, event, key, version=1):
    found = []
    for settings in filter(None, map(read, files)):
        assert settings.get("version") == version, settings
        for hook in settings.get("hooks", {}).get(event, []):
            if hook.get(key) and hook[key] not in found:
                found.append(hook[key])
    return found


def activity(payload, key, tool):
    """An activity event's input: with the tool's name (and input) for a tool event."""
    if tool is not None:
        payload[key] = tool
        payload["tool_input" if key == "tool_name" else "toolArgs"] = {"command": "ls"}
    return payload


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def snake(event):
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(event))


def codex_hash(label, group, handler):
    """The hash Codex 0.171.0 trusts a command hook by: SHA-256 of its normalized form."""
    hook = {"type": "command", "command": handler["command"],
            "timeout": max(handler.get("timeout", 600), 1), "async": handler.get("async", False)}
    if "statusMessage" in handler:
        hook["statusMessage"] = handler["statusMessage"]
    identity = {"event_name": label, "hooks": [hook]}
    if group.get("matcher") is not None:
        identity["matcher"] = group["matcher"]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class Codex:
    """Runs only the hooks its config.toml trusts, as Codex does for hooks not managed."""

    def __init__(self, session, cwd):
        home = os.environ.get("CODEX_HOME") or os.path.join(HOME, ".codex")
        self.files = [os.path.join(home, "hooks.json")]
        try:
            with open(os.path.join(home, "config.toml"), "rb") as f:
                self.state = tomllib.load(f).get("hooks", {}).get("state", {})
        except FileNotFoundError:
            self.state = {}
        self.common = {"session_id": session, "transcript_path": f"{HOME}/{session}.jsonl",
                       "cwd": cwd, "model": "gpt-5", "permission_mode": "default"}

    events = {"start": "SessionStart", "end": "SessionEnd", "prompt": "UserPromptSubmit",
              "stop": "Stop", "tool": "PreToolUse", "tool-end": "PostToolUse"}

    def hooks(self, event):
        name, found = self.events[event], []
        for path in self.files:
            for g, group in enumerate((read(path) or {}).get("hooks", {}).get(name, [])):
                for h, hook in enumerate(group.get("hooks", [])):
                    trust = self.state.get(f"{path}:{snake(name)}:{g}:{h}", {})
                    if (hook.get("type") == "command" and hook["command"] not in found
                            and trust.get("trusted_hash") == codex_hash(snake(name), group, hook)):
                        found.append(hook["command"])
        return found

    def payload(self, event, tool=None):
        if event == "start":
            return dict(self.common, hook_event_name="SessionStart", source="startup")
        if event == "end":
            return dict(self.common, hook_event_name="SessionEnd", reason="other")
        return activity(dict(self.common, hook_event_name=self.events[event]), "tool_name", tool)

    def env(self):
        return {}


class ClaudeCode:
    """Only what the activity tests drive (tests/agents/claude-code-standin.py is the one
    of the session tests): its hooks file, and its prompt, stop and tool events."""

    def __init__(self, session, cwd):
        config = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(HOME, ".claude")
        self.files = [os.path.join(config, "settings.json")]
        self.common = {"session_id": session, "transcript_path": f"{HOME}/{session}.jsonl",
                       "cwd": cwd, "permission_mode": "default"}

    events = {"start": "SessionStart", "end": "SessionEnd", "prompt": "UserPromptSubmit",
              "stop": "Stop", "tool": "PreToolUse", "tool-end": "PostToolUse"}

    def hooks(self, event):
        return grouped(self.files, self.events[event])

    def payload(self, event, tool=None):
        if event == "start":
            return dict(self.common, hook_event_name="SessionStart", source="startup")
        if event == "end":
            return dict(self.common, hook_event_name="SessionEnd", reason="prompt_input_exit")
        return activity(dict(self.common, hook_event_name=self.events[event]), "tool_name", tool)

    def env(self):
        return {"CLAUDE_PROJECT_DIR": self.common["cwd"],
                "CLAUDE_CODE_SESSION_ID": self.common["session_id"]}


class Gemini:
    def __init__(self, session, cwd):
        self.files = [os.path.join(HOME, ".gemini/settings.json"),
                      os.path.join(cwd, ".gemini/settings.json")]
        self.common = {"session_id": session, "transcript_path": f"{HOME}/{session}.json",
                       "cwd": cwd}

    events = {"start": "SessionStart", "end": "SessionEnd", "prompt": "BeforeAgent",
              "stop": "AfterAgent", "tool": "BeforeTool", "tool-end": "AfterTool"}

    def hooks(self, event):
        return grouped(self.files, self.events[event])

    def payload(self, event, tool=None):
        name = self.events[event]
        if event in ("start", "end"):
            extra = {"source": "startup"} if event == "start" else {"reason": "exit"}
            return dict(self.common, hook_event_name=name, timestamp=now(), **extra)
        return activity(dict(self.common, hook_event_name=name, timestamp=now()), "tool_name",
                        tool)

    def env(self):
        cwd = self.common["cwd"]
        return {"GEMINI_PROJECT_DIR": cwd, "GEMINI_CWD": cwd, "CLAUDE_PROJECT_DIR": cwd,
                "GEMINI_SESSION_ID": self.common["session_id"]}


class Copilot:
    def __init__(self, session, cwd):
        self.files = sorted(glob.glob(os.path.join(HOME, ".copilot/hooks/*.json")))
        self.session, self.cwd = session, cwd

    events = {"start": "sessionStart", "end": "sessionEnd", "prompt": "userPromptSubmitted",
              "stop": "agentStop", "tool": "preToolUse", "tool-end": "postToolUse"}

    def hooks(self, event):
        return flat(self.files, self.events[event], "bash")

    def payload(self, event, tool=None):
        millis = int(datetime.datetime.now().timestamp() * 1000)
        common = {"sessionId": self.session, "timestamp": millis, "cwd": self.cwd}
        if event in ("start", "end"):
            extra = {"source": "new"} if event == "start" else {"reason": "user_exit"}
            return dict(common, **extra)
        return activity(common, "toolName", tool)

    def env(self):
        return {}


class Cursor:
    def __init__(self, session, cwd):
        self.files = [os.path.join(HOME, ".cursor/hooks.json"),
                      os.path.join(cwd, ".cursor/hooks.json")]
        self.common = {"session_id": session, "conversation_id": session,
                       "workspace_roots": [cwd], "cwd": cwd}

    events = {"start": "sessionStart", "end": "sessionEnd", "prompt": "beforeSubmitPrompt",
              "stop": "stop", "tool": "preToolUse", "tool-end": "postToolUse"}

    def hooks(self, event):
        return flat(self.files, self.events[event], "command")

    def payload(self, event, tool=None):
        if event == "start":
            return dict(self.common, hook_event_name="sessionStart")
        if event == "end":
            return dict(self.common, hook_event_name="sessionEnd", reason="user_close",
                        duration_ms=1000)
        # Cursor's other events name the conversation, not the session.
        common = {k: v for k, v in self.common.items() if k != "session_id"}
        return activity(dict(common, hook_event_name=self.events[event]), "tool_name", tool)

    def env(self):
        return {}


class Kiro:
    def __init__(self, session, cwd):
        self.files = sorted(glob.glob(os.path.join(HOME, ".kiro/hooks/*.json")))
        self.session, self.cwd = session, cwd

    def hooks(self, event):
        found = []
        for settings in filter(None, map(read, self.files)):
            assert settings.get("version") == "v1", settings
            for hook in settings.get("hooks", []):
                if event == "start" and hook.get("trigger") == "SessionStart":
                    found.append(hook["action"]["command"])
        return found

    def payload(self, event, tool=None):
        return {"session_id": self.session, "hook_event_name": "SessionStart", "cwd": self.cwd}

    def env(self):
        return {}


class KiroAgent:
    """Kiro CLI 2.x run as `kiro-cli chat --agent NAME` (NAME in $STANDIN_KIRO_AGENT): the
    hooks of that agent's own file, and inputs that name no session."""

    def __init__(self, session, cwd):
        name = os.environ["STANDIN_KIRO_AGENT"]
        self.file = os.path.join(HOME, ".kiro/agents", name + ".json")
        self.cwd = cwd

    events = {"start": "agentSpawn", "prompt": "userPromptSubmit", "stop": "stop",
              "tool": "preToolUse", "tool-end": "postToolUse"}

    def hooks(self, event):
        if event not in self.events:
            return []  # no end hook
        hooks = (read(self.file) or {}).get("hooks", {}).get(self.events[event], [])
        return [hook["command"] for hook in hooks if hook.get("command")]

    def payload(self, event, tool=None):
        payload = {"hook_event_name": self.events.get(event, event), "cwd": self.cwd}
        if event == "prompt":
            payload["prompt"] = "hello"
        if tool is not None:
            payload["tool_name"], payload["tool_input"] = tool, {"command": "ls"}
        return payload

    def env(self):
        return {}


AGENTS = {"claude": ClaudeCode, "codex": Codex, "gemini": Gemini, "copilot": Copilot, "cursor-agent": Cursor,
          "kiro-cli": Kiro}


def run(agent, event, cwd, tool=None):
    """Runs the event's hooks in parallel, as the agents do; their statuses."""
    running = []
    for command in agent.hooks(event):
        process = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, cwd=cwd,
                                   env=dict(os.environ, **agent.env()))
        try:
            process.stdin.write(json.dumps(agent.payload(event, tool)).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass  # a hook that reads no input (`true`)
        running.append(process)
    statuses = []
    for process in running:
        out = process.stdout.read()
        # Gemini reads a hook's stdout as JSON; every agent here insists on nothing else.
        assert out.strip() == b"" or json.loads(out) is not None, out
        statuses.append(process.wait())
    return statuses


def trust(home):
    """Trusts every hook in HOME/.codex/hooks.json, as a user trusting them in Codex's /hooks
    would: config.toml gets a trusted_hash for each."""
    path = os.path.join(home, ".codex/hooks.json")
    lines = []
    for name, groups in read(path)["hooks"].items():
        for g, group in enumerate(groups):
            for h, hook in enumerate(group["hooks"]):
                lines.append(f'[hooks.state."{path}:{snake(name)}:{g}:{h}"]\n'
                             f'trusted_hash = "{codex_hash(snake(name), group, hook)}"\n')
    with open(os.path.join(home, ".codex/config.toml"), "w") as f:
        f.write('model = "gpt-5"\n\n' + "".join(lines))


def main():
    if sys.argv[1] == "--trust":
        return trust(sys.argv[2])
    name = os.path.basename(sys.argv[0])
    if name == "kiro-cli" and "STANDIN_KIRO_AGENT" in os.environ:
        name = "kiro-cli --agent"
    agent = dict(AGENTS, **{"kiro-cli --agent": KiroAgent})[name](*sys.argv[1:3])
    cwd = sys.argv[2]
    if any(run(agent, "start", cwd)) and isinstance(agent, Kiro):
        sys.exit(1)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split(" ", 1)
        if words[0].strip() in ("prompt", "stop", "tool", "tool-end"):
            # An activity event, its hooks run; "tool" is followed by the tool's name as a
            # JSON string. "ok" when every hook exited 0, else their statuses.
            tool = json.loads(words[1]) if words[0] == "tool" else None
            statuses = run(agent, words[0].strip(), cwd, tool)
            print("ok" if not any(statuses) else f"failed {statuses}", flush=True)
            continue
        for _ in range({"exit": 1, "exit-twice": 2}.get(line.strip(), 0)):
            run(agent, "end", cwd)
        break


if __name__ == "__main__":
    main()
