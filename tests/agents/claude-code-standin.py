#!/usr/bin/env python3
"""A stand-in for Claude Code that follows its documented hook protocol (see
liveness-cli/src/hooks/claude_code.rs for the version followed), for the adapter's tests.

It reads the user settings ($CLAUDE_CONFIG_DIR/settings.json) and the project's
(<cwd>/.claude/settings.json and settings.local.json), runs every SessionStart command hook
(`sh -c COMMAND`, or `COMMAND ARGS...` in exec form) with the hook input as JSON on stdin
and CLAUDE_PROJECT_DIR set, prints "ready", then waits for a line on stdin. "exit" ends the
session as Claude Code does on /exit: its SessionEnd hooks run (in parallel, reason
`prompt_input_exit`), then it exits 0. Killed instead, it runs nothing, as Claude Code.

Usage: claude-code-standin.py SESSION_ID CWD TRANSCRIPT_PATH
"""

import json
import os
import subprocess
import sys


def settings_files(cwd):
    config = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.environ["HOME"], ".claude")
    return [
        os.path.join(config, "settings.json"),
        os.path.join(cwd, ".claude", "settings.json"),
        os.path.join(cwd, ".claude", "settings.local.json"),
    ]


def hooks_of(event, value, cwd):
    """The command hooks of `event` whose matcher selects `value`, from every file."""
    found = []
    for path in settings_files(cwd):
        try:
            with open(path) as f:
                settings = json.load(f)
        except FileNotFoundError:
            continue
        if settings.get("disableAllHooks"):
            return []
        for group in settings.get("hooks", {}).get(event, []):
            matcher = group.get("matcher", "")
            if matcher not in ("", "*") and value not in matcher.split("|"):
                continue
            for hook in group.get("hooks", []):
                if hook.get("type") == "command" and hook not in found:
                    found.append(hook)
    return found


def start(hook, payload, cwd):
    if "args" in hook:
        argv = [hook["command"], *hook["args"]]
    else:
        argv = [hook.get("shell", "sh"), "-c", hook["command"]]
    env = dict(os.environ, CLAUDE_PROJECT_DIR=cwd)
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, cwd=cwd, env=env)
    process.stdin.write(json.dumps(payload).encode())
    process.stdin.close()
    return process


def main():
    session_id, cwd, transcript = sys.argv[1:4]
    common = {
        "session_id": session_id,
        "transcript_path": transcript,
        "cwd": cwd,
        "permission_mode": "default",
    }
    for hook in hooks_of("SessionStart", "startup", cwd):
        payload = dict(common, hook_event_name="SessionStart", source="startup")
        start(hook, payload, cwd).wait()
    print("ready", flush=True)
    line = sys.stdin.readline().strip()
    if line == "exit":
        payload = dict(common, hook_event_name="SessionEnd", reason="prompt_input_exit")
        running = [start(hook, payload, cwd) for hook in hooks_of("SessionEnd", "prompt_input_exit", cwd)]
        for process in running:
            process.wait()


if __name__ == "__main__":
    main()
