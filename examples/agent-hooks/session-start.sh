#!/bin/sh
# Agent "session start" hook: tell livenessd that this agent session is owned by the
# agent process, so the session ends the moment the agent dies, however it dies.
#
# Session id: $SESSION_ID if set, else "session_id" from the hook's JSON on stdin
# (e.g. {"session_id":"...","cwd":"...",...}, as Claude Code and similar agents send it).
#
# Why --owner auto: the daemon starts from the process that connects to it (this
# `liveness` command) and walks up its parents, skipping `liveness`, shells (sh, bash,
# dash, zsh...) and `env`, to the first real program: the agent that ran this hook. So the
# owner is neither this short-lived script (whose exit would end the session at once) nor
# a launch wrapper that started the agent and exited (it is not an ancestor of the hook,
# so its exit is not mistaken for the agent's). If the hook runs under another
# intermediate program (timeout, npx, uv...), add `--wrapper NAME` to the register line
# below (`liveness register` warns when the owner it found is such a launcher);
# `liveness resolve-owner` run from the hook prints the owner the walk finds.
#
# A hook must not break the agent: problems are reported on stderr, the exit status is
# always 0, and nothing is printed on stdout (some agents add a hook's stdout to the
# model's context).
set -eu

. "$(dirname "$0")/session-id.sh"

id=$(session_id)
if [ -z "$id" ]; then
    echo "session-start: no session id (set SESSION_ID or pass the hook JSON on stdin)" >&2
    exit 0
fi

# The lock file that must not outlive the session: on-ended.sh, the session's end
# action, removes it when the session ends, whether by session-end.sh, a crash, kill -9
# or a reboot.
lock_dir=${AGENT_LOCK_DIR:-${XDG_RUNTIME_DIR:-/tmp}/agent-locks}
here=$(cd "$(dirname "$0")" && pwd)

# --on-end terminate: when the session ends, however it ends, the processes the agent
# started (MCP servers, dev servers, watchers), even orphaned ones, get SIGTERM, then
# SIGKILL after the grace. The agent itself, if still alive, and the processes still
# under it are left alone: only what it left behind is ended. Set
# AGENT_ON_END=leave to keep them running.
# --on-end-run: livenessd runs on-ended.sh once when the session ends (the command goes
# through sh -c; these paths hold no single quote).
if ! liveness register --session "$id" --owner auto --label tool=agent \
    --on-end "${AGENT_ON_END:-terminate}" --grace "${AGENT_GRACE:-5s}" \
    --on-end-run "'$here/on-ended.sh' '$lock_dir'" >/dev/null; then
    echo "session-start: could not register session $id with livenessd" >&2
    exit 0
fi

case $id in
*[!A-Za-z0-9._-]*) ;; # not a safe file name: no lock
*)
    mkdir -p "$lock_dir"
    printf '%s\n' "$id" >"$lock_dir/$id.lock"
    ;;
esac
exit 0
