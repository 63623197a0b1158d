#!/usr/bin/python3
"""A stand-in for Codex, Gemini CLI, Copilot CLI, Cursor's agent and Kiro CLI, chosen by the
name it is run under (codex, gemini, copilot, cursor-agent, kiro-cli, as the real ones), for
the adapters' tests. It follows each agent's hook protocol as
liveness-cli/src/hooks/AGENT.rs records it: reads the agent's hook files from $HOME (and
the project's), runs every session-start command hook with `sh -c` and the agent's own
hook input on stdin, prints "ready", then reads lines on stdin: "exit" runs the end hooks
(reason: the agent's own for a user's exit) and exits 0; "exit-twice" runs them twice (as
Gemini CLI is reported to). Killed, it runs nothing, as the real agents. A start hook that
exits non-zero ends a Kiro session (exit 1), as Kiro does.

Usage: AGENT SESSION_ID CWD
"""

import datetime
import glob
import json
import os
import subprocess
import sys

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


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Codex:
    def __init__(self, session, cwd):
        home = os.environ.get("CODEX_HOME") or os.path.join(HOME, ".codex")
        self.files = [os.path.join(home, "hooks.json")]
        self.common = {"session_id": session, "transcript_path": f"{HOME}/{session}.jsonl",
                       "cwd": cwd, "model": "gpt-5", "permission_mode": "default"}

    def hooks(self, event):
        return grouped(self.files, {"start": "SessionStart", "end": "SessionEnd"}[event])

    def payload(self, event):
        if event == "start":
            return dict(self.common, hook_event_name="SessionStart", source="startup")
        return dict(self.common, hook_event_name="SessionEnd", reason="other")

    def env(self):
        return {}


class Gemini:
    def __init__(self, session, cwd):
        self.files = [os.path.join(HOME, ".gemini/settings.json"),
                      os.path.join(cwd, ".gemini/settings.json")]
        self.common = {"session_id": session, "transcript_path": f"{HOME}/{session}.json",
                       "cwd": cwd}

    def hooks(self, event):
        return grouped(self.files, {"start": "SessionStart", "end": "SessionEnd"}[event])

    def payload(self, event):
        name = {"start": "SessionStart", "end": "SessionEnd"}[event]
        extra = {"source": "startup"} if event == "start" else {"reason": "exit"}
        return dict(self.common, hook_event_name=name, timestamp=now(), **extra)

    def env(self):
        cwd = self.common["cwd"]
        return {"GEMINI_PROJECT_DIR": cwd, "GEMINI_CWD": cwd, "CLAUDE_PROJECT_DIR": cwd,
                "GEMINI_SESSION_ID": self.common["session_id"]}


class Copilot:
    def __init__(self, session, cwd):
        self.files = sorted(glob.glob(os.path.join(HOME, ".copilot/hooks/*.json")))
        self.session, self.cwd = session, cwd

    def hooks(self, event):
        return flat(self.files, {"start": "sessionStart", "end": "sessionEnd"}[event], "bash")

    def payload(self, event):
        extra = {"source": "new"} if event == "start" else {"reason": "user_exit"}
        millis = int(datetime.datetime.now().timestamp() * 1000)
        return {"sessionId": self.session, "timestamp": millis, "cwd": self.cwd, **extra}

    def env(self):
        return {}


class Cursor:
    def __init__(self, session, cwd):
        self.files = [os.path.join(HOME, ".cursor/hooks.json"),
                      os.path.join(cwd, ".cursor/hooks.json")]
        self.common = {"session_id": session, "conversation_id": session,
                       "workspace_roots": [cwd], "cwd": cwd}

    def hooks(self, event):
        return flat(self.files, {"start": "sessionStart", "end": "sessionEnd"}[event], "command")

    def payload(self, event):
        if event == "start":
            return dict(self.common, hook_event_name="sessionStart")
        return dict(self.common, hook_event_name="sessionEnd", reason="user_close",
                    duration_ms=1000)

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

    def payload(self, event):
        return {"session_id": self.session, "hook_event_name": "SessionStart", "cwd": self.cwd}

    def env(self):
        return {}


AGENTS = {"codex": Codex, "gemini": Gemini, "copilot": Copilot, "cursor-agent": Cursor,
          "kiro-cli": Kiro}


def run(agent, event, cwd):
    """Runs the event's hooks in parallel, as the agents do; their statuses."""
    running = []
    for command in agent.hooks(event):
        process = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, cwd=cwd,
                                   env=dict(os.environ, **agent.env()))
        process.stdin.write(json.dumps(agent.payload(event)).encode())
        process.stdin.close()
        running.append(process)
    statuses = []
    for process in running:
        out = process.stdout.read()
        # Gemini reads a hook's stdout as JSON; every agent here insists on nothing else.
        assert out.strip() == b"" or json.loads(out) is not None, out
        statuses.append(process.wait())
    return statuses


def main():
    agent = AGENTS[os.path.basename(sys.argv[0])](*sys.argv[1:3])
    cwd = sys.argv[2]
    if any(run(agent, "start", cwd)) and isinstance(agent, Kiro):
        sys.exit(1)
    print("ready", flush=True)
    line = sys.stdin.readline().strip()
    for _ in range({"exit": 1, "exit-twice": 2}.get(line, 0)):
        run(agent, "end", cwd)


if __name__ == "__main__":
    main()
