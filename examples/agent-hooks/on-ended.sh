#!/bin/sh
# Event handler for
#   liveness watch --exec ./on-ended.sh --cursor "$HOME/.local/state/agent-hooks.cursor"
# which runs it (through sh -c) once per session.ended event, with the event's stream line
# ({"event":{...}}) on stdin and these variables (empty when they do not apply):
#   LIVENESS_SEQ          the event's seq (the watcher saves it in the cursor file after
#                         this script succeeds; on failure it stops, exit code 75, and
#                         the next run starts with the same event)
#   LIVENESS_SESSION      the session id
#   LIVENESS_REASON       owner_exited, owner_reused, reboot, stopped, timeout, pending_expired
#   LIVENESS_EXIT_CODE    the owner's exit code, when it exited and the code is known
#   LIVENESS_SIGNAL       the signal that killed the owner, when it was killed
#   LIVENESS_DETECTED_BY  ebpf, pidfd, procpoll or reconcile (empty for stopped, timeout...)
#   LIVENESS_OWNER_PID    the owner's PID
#
# This one releases the lock file session-start.sh created, whatever way the session
# ended. It must be idempotent: after a crash of the watcher between running it and
# saving the cursor, the same event is delivered again.
set -eu

event=$(cat)
# The watcher only runs this for session.ended; the check keeps a hand-fed event of
# another kind (session.registered, session.owner_changed, session.renamed) harmless.
if ! printf '%s' "$event" | grep -Eq '"kind"[[:space:]]*:[[:space:]]*"session\.ended"'; then
    exit 0
fi

session=${LIVENESS_SESSION:?LIVENESS_SESSION is not set: run me from liveness watch --exec}
reason=${LIVENESS_REASON:-unknown}
if [ -n "${LIVENESS_SIGNAL:-}" ]; then
    how="killed by signal $LIVENESS_SIGNAL"
elif [ -n "${LIVENESS_EXIT_CODE:-}" ]; then
    how="exit code $LIVENESS_EXIT_CODE"
else
    how="no exit status"
fi

lock_dir=${AGENT_LOCK_DIR:-${XDG_RUNTIME_DIR:-/tmp}/agent-locks}
case $session in
*[!A-Za-z0-9._-]*) exit 0 ;; # session-start.sh made no lock for such an id
esac
lock=$lock_dir/$session.lock
[ -e "$lock" ] || exit 0 # not one of ours, or already released
rm -f "$lock"
printf 'event %s: session %s ended (%s, %s): released %s\n' \
    "${LIVENESS_SEQ:-?}" "$session" "$reason" "$how" "$lock"
