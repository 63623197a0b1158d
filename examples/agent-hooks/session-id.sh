# Sourced by the hooks: prints the session id, from $SESSION_ID or else from the
# "session_id" field of the hook's JSON on stdin (empty when neither has one).
session_id() {
    if [ -n "${SESSION_ID:-}" ]; then
        printf '%s\n' "$SESSION_ID"
        return 0
    fi
    [ -t 0 ] && return 0
    input=$(cat)
    if command -v python3 >/dev/null 2>&1 &&
        printf '%s' "$input" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("session_id") or "")' 2>/dev/null; then
        return 0
    fi
    # No python3 (or not JSON): a plain id without quotes or backslashes.
    printf '%s' "$input" | tr -d '\n' |
        sed -n 's/.*"session_id"[[:space:]]*:[[:space:]]*"\([^"\\]*\)".*/\1/p'
}
