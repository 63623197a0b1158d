#!/bin/sh
# Agent "session end" hook: end the session explicitly (reason "stopped").
#
# When the agent skips this hook (crash, kill -9, closed terminal, reboot), livenessd
# ends the session anyway, with reason owner_exited, owner_reused or reboot: this hook
# only makes a clean stop explicit and immediate.
#
# Session id as in session-start.sh: $SESSION_ID, else "session_id" from the JSON on
# stdin. Never fails the agent: problems go to stderr, the exit status is always 0.
set -eu

. "$(dirname "$0")/session-id.sh"

id=$(session_id)
if [ -z "$id" ]; then
    echo "session-end: no session id (set SESSION_ID or pass the hook JSON on stdin)" >&2
    exit 0
fi

# Fails harmlessly (already_ended) when the owner's death got there first.
if ! liveness end --session "$id" >/dev/null; then
    echo "session-end: could not end session $id (see above)" >&2
fi
exit 0
