#!/bin/sh
# End action, registered by session-start.sh:
#   liveness register ... --on-end-run "'/path/to/on-ended.sh' 'LOCK_DIR'"
# livenessd runs it (through sh -c) once when the session ends, whatever ended it, as the
# user who registered it, without privileges, with the end facts as JSON on stdin and
# these variables (unset when they do not apply):
#   LIVENESS_SESSION      the session id
#   LIVENESS_REASON       owner_exited, owner_reused, reboot, stopped, timeout, pending_expired
#   LIVENESS_EXIT_CODE    the owner's exit code, when it exited and the code is known
#   LIVENESS_EXIT_SIGNAL  the signal that killed the owner, when it was killed
#   LIVENESS_DETECTED_BY  ebpf, pidfd, procpoll or reconcile (unset for stopped, timeout...)
#   LIVENESS_OWNER_PID    the owner's PID
#   LIVENESS_RESUMED      1 when a crash or stop of the daemon cut an earlier run short
# Its exit status and the end of its stderr are recorded: `liveness get --session ID`.
#
# This one releases the lock file session-start.sh created. It is idempotent: a run cut
# short is run again.
set -eu

session=${LIVENESS_SESSION:?LIVENESS_SESSION is not set: livenessd runs me as an end action}
lock_dir=${1:?usage: on-ended.sh LOCK_DIR}
reason=${LIVENESS_REASON:-unknown}
if [ -n "${LIVENESS_EXIT_SIGNAL:-}" ]; then
    how="killed by signal $LIVENESS_EXIT_SIGNAL"
elif [ -n "${LIVENESS_EXIT_CODE:-}" ]; then
    how="exit code $LIVENESS_EXIT_CODE"
else
    how="no exit status"
fi

case $session in
*[!A-Za-z0-9._-]*) exit 0 ;; # session-start.sh made no lock for such an id
esac
lock=$lock_dir/$session.lock
[ -e "$lock" ] || exit 0 # already released
rm -f "$lock"
# stderr is kept with the outcome.
printf 'session %s ended (%s, %s): released %s\n' "$session" "$reason" "$how" "$lock" >&2
