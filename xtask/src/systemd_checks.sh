#!/bin/bash
# The checks of `cargo xtask vm-test --systemd`, run as root in a Debian guest booted with
# systemd as PID 1. The packages come on a disk of their own, mounted at /payload:
# new.deb (this tree's) and previous.deb (the previous release's).
#
# Each check runs in a subshell with errexit and prints one line on the console,
# `VMCHECK ok|FAILED MILLISECONDS NAME`, after its own output (prefixed `VMLOG`);
# `VMFACT KEY VALUE` lines carry what the host records (versions, the security score) and
# `VMDONE` ends the run. Checks build on each other's state, in this order: a fresh
# install and what it runs, removal and purge, a machine without systemd, then an upgrade
# from the previous release.
set -uo pipefail

new_deb=/payload/new.deb
previous_deb=/payload/previous.deb
# The console: check output is captured, facts go straight out.
exec 3>&1
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive

fact() { echo "VMFACT $*" >&3; }

check() {
    local name=$1
    shift
    local started log status
    started=$(date +%s%N)
    log=$(mktemp)
    (
        set -euo pipefail
        "$@"
    ) >"$log" 2>&1
    status=$?
    sed 's/^/VMLOG /' "$log"
    rm -f "$log"
    local millis=$((($(date +%s%N) - started) / 1000000))
    if [ "$status" = 0 ]; then
        echo "VMCHECK ok $millis $name"
    else
        echo "VMCHECK FAILED $millis $name"
    fi
}

# expect WHAT COMMAND...: fails the check, saying WHAT, unless COMMAND succeeds.
expect() {
    local what=$1
    shift
    if ! "$@"; then
        echo "expected: $what ($*)" >&2
        exit 1
    fi
}

# within SECONDS COMMAND...: retries COMMAND every 0.1 s until it succeeds.
within() {
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "still failing after the deadline: $*" >&2
            return 1
        fi
        sleep 0.1
    done
}

# An unprivileged user, as a login would make them (no capabilities, their own groups).
# A command, not a function, so that `"${alice[@]}" CMD &` gives CMD's own pid in $!.
alice=(setpriv --reuid=alice --regid=alice --init-groups env HOME=/home/alice USER=alice)
as_alice() { "${alice[@]}" "$@"; }

# Starts a process of alice's that sleeps; prints its pid.
alice_sleeper() {
    "${alice[@]}" sleep 1000 >/dev/null 2>&1 &
    echo $!
}

phase() { liveness get --uid "$(id -u alice)" --session "$1" --json | jq -r .phase; }
ended() { [ "$(phase "$1")" = ended ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }
subscribed() { [ "$(liveness status --json | jq .subscribers)" -ge 1 ]; }
active() { [ "$(systemctl is-active livenessd)" = active ]; }
main_pid() { systemctl show -p MainPID --value livenessd; }
journal_cursor() { journalctl -u livenessd -n 0 --show-cursor | sed -n 's/^-- cursor: //p'; }
# The daemon's journal entries after CURSOR whose message is MESSAGE, counted.
messages_since() { journalctl -u livenessd --after-cursor "$1" -o json | jq -c "select(.MESSAGE == \"$2\")" | wc -l; }

# The sources the daemon runs, as USER sees them: eBPF and pidfd active (eBPF's start-up
# self-test saw a death), the /proc poller on standby, nothing off or degraded.
sources_active() {
    local status
    status=$("$@" liveness status --json)
    jq -c '.monitor.sources[] | {name, state, reason, self_test}' <<<"$status"
    expect "eBPF active, its self-test passed" \
        jq -e '.monitor.sources[] | select(.name == "ebpf") | .state == "active" and .self_test.passed' <<<"$status"
    expect "pidfd active" jq -e '.monitor.sources[] | select(.name == "pidfd") | .state == "active"' <<<"$status"
    expect "no source off or degraded" \
        jq -e '[.monitor.sources[] | select(.state == "off" or .state == "degraded")] | length == 0' <<<"$status"
}

# As the README's Install section says (apt-get resolves the dependencies, dpkg -i does not).
fresh_install() {
    apt-get install -y "$new_deb"
    fact new_version "$(dpkg-query -W -f '${Version}' liveness)"
    expect "the package enabled the unit" [ "$(systemctl is-enabled livenessd)" = enabled ]
    expect "the package started the daemon" active
    # Type=notify: started means listening.
    liveness status >/dev/null
    systemctl status --no-pager livenessd || true
    # Start-up found nothing to warn about: no probe refused by the sandbox, no limit it
    # could not raise.
    journalctl -u livenessd -b --no-pager -o cat
    expect "no warning at start" [ -z "$(journalctl -u livenessd -b -p warning -o cat)" ]
}

# The unit's --ebpf-pin-dir: the lineage programs pinned in the bpffs systemd mounted,
# which the sandbox lets the daemon write.
lineage_pinned() {
    liveness status --json | jq -e '.membership.lineage_pins | startswith("/sys/fs/bpf/liveness/")'
}

status_as_root() {
    sources_active env
    liveness status --json | jq -c '.membership | {lineage_since_ms, lineage_pins, lineage_unpinned}'
    expect "lineage programs pinned" lineage_pinned
}
status_as_user() { sources_active as_alice; }

sigkill_ends_session() {
    local owner code=0
    owner=$(alice_sleeper)
    as_alice liveness register --session killed --owner-pid "$owner"
    kill -KILL "$owner"
    # Exit code 2: the owner was killed by a signal.
    timeout 20 liveness wait --uid "$(id -u alice)" --session killed || code=$?
    liveness get --uid "$(id -u alice)" --session killed --json | jq -c '{phase, reason, exit, detected_by}'
    expect "wait says killed by a signal" [ "$code" = 2 ]
}

journal_fields() {
    local entries
    entries=$(journalctl -u livenessd -o json | jq -c 'select(.SESSION == "killed")')
    jq -c '{MESSAGE, SESSION, UID, OWNER_PID, REASON, SOURCE, EXIT, LATENCY_MS, SEQ, PRIORITY, SYSLOG_IDENTIFIER}' <<<"$entries"
    expect "one entry for the registration" [ "$(jq -c 'select(.MESSAGE == "session registered")' <<<"$entries" | wc -l)" = 1 ]
    expect "one entry for the end" [ "$(jq -c 'select(.MESSAGE == "session ended")' <<<"$entries" | wc -l)" = 1 ]
    local session
    session=$(liveness get --uid "$(id -u alice)" --session killed --json)
    expect "the end's REASON and SOURCE fields are the session's" jq -e --argjson s "$session" \
        'select(.MESSAGE == "session ended") | .REASON == $s.reason and .SOURCE == $s.detected_by and .OWNER_PID == ($s.owner.pid | tostring)' <<<"$entries"
    journalctl -u livenessd --no-pager SESSION=killed
}

# A session's leftover process is signalled by the daemon inside its sandbox: root
# without CAP_KILL could not signal another user's process.
reap_in_sandbox() {
    rm -f /tmp/go /tmp/survivor
    "${alice[@]}" bash -c 'while [ ! -e /tmp/go ]; do sleep 0.1; done; setsid sleep 1000 & echo $! >/tmp/survivor' &
    local owner=$! survivor
    as_alice liveness register --session reap --owner-pid "$owner" --on-end terminate --grace 2s
    touch /tmp/go
    within 10 test -s /tmp/survivor
    survivor=$(cat /tmp/survivor)
    within 20 ended reap
    if ! within 20 gone "$survivor"; then
        journalctl -u livenessd -o json -n 20 | jq -c '{MESSAGE, PID, ERROR}'
        exit 1
    fi
    liveness get --uid "$(id -u alice)" --session reap --json | jq -c '{phase, reason, survivors}'
}

restart_loses_nothing() {
    local one two token head since pid
    one=$(alice_sleeper)
    two=$(alice_sleeper)
    as_alice liveness register --session kept-1 --owner-pid "$one"
    as_alice liveness register --session kept-2 --owner-pid "$two"
    token=$(as_alice liveness lock acquire build --session kept-1)
    head=$(liveness status --json | jq .head_seq)
    since=$(liveness status --json | jq .membership.lineage_since_ms)
    pid=$(main_pid)
    systemctl restart livenessd
    expect "a new daemon" [ "$(main_pid)" != "$pid" ]
    expect "no event lost" [ "$(liveness status --json | jq .head_seq)" = "$head" ]
    expect "the pinned lineage programs adopted, complete since their first load" \
        [ "$(liveness status --json | jq .membership.lineage_since_ms)" = "$since" ]
    expect "both sessions still active" [ "$(phase kept-1)$(phase kept-2)" = activeactive ]
    as_alice liveness lock list --json | jq -c .
    expect "the lock still held, with its token" \
        as_alice sh -c "liveness lock list --json | jq -e '.[] | select(.name == \"build\") | .session == \"kept-1\" and .token == $token'"
    # The restarted daemon watches the owners it found.
    kill -KILL "$two"
    within 10 ended kept-2
    # Fencing tokens keep growing.
    as_alice liveness end --session kept-1
    local three next
    three=$(alice_sleeper)
    as_alice liveness register --session kept-3 --owner-pid "$three"
    next=$(as_alice liveness lock acquire build --session kept-3)
    expect "a greater token ($next > $token)" [ "$next" -gt "$token" ]
    kill -KILL "$one" "$three"
}

crash_restart_reconciles() {
    local owner restarts pid
    owner=$(alice_sleeper)
    as_alice liveness register --session crashed --owner-pid "$owner"
    restarts=$(systemctl show -p NRestarts --value livenessd)
    pid=$(main_pid)
    systemctl kill -s KILL livenessd
    # The owner dies while no daemon runs (RestartSec=1s).
    within 5 gone "$pid"
    kill -KILL "$owner"
    within 30 active
    within 30 liveness status
    expect "restarted once by Restart=on-failure" [ "$(systemctl show -p NRestarts --value livenessd)" = $((restarts + 1)) ]
    within 10 ended crashed
    liveness get --uid "$(id -u alice)" --session crashed --json | jq -c '{phase, reason, detected_by}'
    expect "ended by the reconcile at start" \
        [ "$(liveness get --uid "$(id -u alice)" --session crashed --json | jq -r .detected_by)" = reconcile ]
}

# Session cgroups where systemd is the init (docs/cgroups.md#systemd): a transient scope
# under liveness.slice, asked for over the system bus from inside the unit's sandbox.
scope_units() { systemctl list-units --all --plain --no-legend 'liveness-*.scope' | awk '{print $1}'; }
no_scope_left() { [ -z "$(scope_units)" ]; }
root_get() { liveness get --session "$1" --json; }
scope_path() { root_get "$1" | jq -r '.cgroup.path // empty'; }
scope_of() { basename "$(scope_path "$1")"; }
root_ended() { [ "$(root_get "$1" | jq -r .phase)" = ended ]; }
has_scope() { [ -n "$(scope_path "$1")" ]; }
# counted SESSION JQ MIN: the session's cgroup counter at JQ is at least MIN.
counted() { [ "$(root_get "$1" | jq -r "$2 // -1")" -ge "$3" ]; }
matches() { [[ $1 =~ $2 ]]; }

# Under the shipped unit, as installed: the daemon reaches the system bus from its sandbox.
systemd_scope_shipped_unit() {
    expect "status names systemd as the cgroups' maker" \
        [ "$(liveness status --json | jq -r .cgroup.manager)" = systemd ]
    liveness status --json | jq -c .cgroup
    local owner said
    owner=$(alice_sleeper)
    said=$(liveness register --uid "$(id -u alice)" --session shipped --owner-pid "$owner" --cgroup 2>&1 >/dev/null)
    expect "no warning: the scope started ($said)" [ -z "$said" ]
    expect "the owner is in a scope of the daemon's" grep -q '/liveness.slice/liveness-s[0-9-]*\.scope$' "/proc/$owner/cgroup"
    cat "/proc/$owner/cgroup"
    kill -KILL "$owner"
    within 10 ended shipped
    within 10 no_scope_left
}

systemd_scope() {
    liveness status --json | jq -c .cgroup
    expect "status names systemd as the cgroups' maker" \
        [ "$(liveness status --json | jq -r .cgroup.manager)" = systemd ]
    liveness doctor | grep -A2 'Cgroups:'
    liveness doctor | grep -q 'made by systemd'
    liveness run --cgroup --memory-max 64M --tasks-max 32 --session scoped -- sleep 1000 &
    local run=$! unit owner
    within 10 has_scope scoped
    unit=$(scope_of scoped)
    echo "scope: $unit"
    expect "a scope of the daemon's naming ($unit)" matches "$unit" '^liveness-s0-[0-9]+-[0-9]+\.scope$'
    systemctl status --no-pager "$unit" || true
    systemctl show -p ControlGroup -p MemoryMax -p TasksMax -p Slice -p Description "$unit"
    expect "its cgroup is where the session says" \
        [ "/sys/fs/cgroup$(systemctl show -p ControlGroup --value "$unit")" = "$(scope_path scoped)" ]
    expect "under liveness.slice" [ "$(systemctl show -p Slice --value "$unit")" = liveness.slice ]
    expect "MemoryMax 64M" [ "$(systemctl show -p MemoryMax --value "$unit")" = 67108864 ]
    expect "memory.max written by systemd" [ "$(cat "$(scope_path scoped)/memory.max")" = 67108864 ]
    owner=$(root_get scoped | jq -r .owner.pid)
    expect "the owner is in the scope" grep -q "/liveness.slice/$unit\$" "/proc/$owner/cgroup"
    kill -TERM "$owner"
    wait "$run" || true
    within 10 root_ended scoped
    within 10 no_scope_left
    # The owner execs `sleep` in the scope (`run` registers first), so the scope's CPU
    # time is above 0; a read made when the scope appeared, before the exec, and kept
    # because systemd removed the cgroup before the last read, says 0, and a last read
    # cut short by the removal lacks it. What the session kept is in the failure.
    local status=0
    within 10 counted scoped .cgroup.usage.cpu_usec 1 || status=$?
    [ "$status" = 0 ] || journalctl -u livenessd --no-pager -n 40
    expect "the scope's CPU time is counted: $(root_get scoped | jq -c .cgroup.usage)" \
        [ "$status" = 0 ]
}

systemd_scope_hog() {
    local status=0
    # bash keeps the whole output of the substitution: 300 MB against 64M.
    liveness run --cgroup --memory-max 64M --session hog -- \
        bash -c 'x=$(head -c 300000000 /dev/zero | tr "\0" a); echo survived ${#x}' || status=$?
    echo "exit status $status"
    expect "the hog was killed" [ "$status" != 0 ]
    within 10 root_ended hog
    within 10 counted hog .cgroup.usage.memory_events.oom_kill 1
    root_get hog | jq -c '{reason, cause, cgroup}'
    expect "the cause names the scope" \
        [ "$(root_get hog | jq -r .cause.cgroup)" = "/liveness.slice/$(scope_of hog)" ]
    within 10 no_scope_left
    expect "the daemon lives on" active
}

systemd_scope_after_crash() {
    local owner unit pid
    liveness run --cgroup --session crashscope -- sleep 1000 &
    within 10 has_scope crashscope
    unit=$(scope_of crashscope)
    owner=$(root_get crashscope | jq -r .owner.pid)
    pid=$(main_pid)
    systemctl kill -s KILL livenessd
    within 5 gone "$pid"
    expect "the scope outlives the daemon's crash while its owner lives" \
        [ "$(systemctl is-active "$unit")" = active ]
    kill -KILL "$owner"
    within 30 active
    within 30 liveness status
    within 10 root_ended crashscope
    root_get crashscope | jq -c '{phase, detected_by, cgroup}'
    within 10 no_scope_left
    expect "status still says systemd" [ "$(liveness status --json | jq -r .cgroup.manager)" = systemd ]
}

# A scope of the daemon's naming that no session has (left by a daemon SIGKILLed before it
# stored its session, say), found at the next start by asking systemd (ListUnitsByPatterns)
# and killed: its process is gone, no liveness-* unit is left. The daemon is stopped while
# the stray is made: SIGKILLed, systemd would restart it (and it would kill the stray)
# before the scope were seen active.
# Whether UNIT is active, asked each time it is called (`within` retries its command, not
# an expansion made once before it).
unit_active() { [ "$(systemctl is-active "$1")" = active ]; }
# Whether the cgroup at PATH holds at least N processes: holds_at_least N PATH.
holds_at_least() { [ "$(wc -l <"$2/cgroup.procs")" -ge "$1" ]; }

systemd_leftover_scope() {
    local stray
    systemctl stop livenessd
    # systemd-run --scope moves itself into the scope and execs the command: $! is it.
    systemd-run --scope --unit=liveness-s0-1-1 --slice=liveness.slice sleep 1000 &
    stray=$!
    within 10 unit_active liveness-s0-1-1.scope
    echo "stray scope liveness-s0-1-1.scope, process $stray"
    systemctl start livenessd
    within 30 liveness status
    within 10 gone "$stray"
    within 10 no_scope_left
    journalctl -u livenessd --no-pager -n 50 | grep -i 'left behind' || true
}

# end --terminate of a cgroup session whose tree is a fork loop held by --tasks-max: systemd's
# KillUnit leaves nothing, and one session.reaped is published.
systemd_scope_terminate_fork_loop() {
    liveness run --cgroup --tasks-max 16 --session forkloop -- \
        bash -c 'while :; do sleep 1000 & done 2>/dev/null' &
    local run=$! unit path
    within 10 has_scope forkloop
    unit=$(scope_of forkloop)
    path=$(scope_path forkloop)
    within 10 holds_at_least 10 "$path"
    local pids
    pids=$(cat "$path/cgroup.procs")
    echo "$(echo "$pids" | wc -l) processes in $unit"
    liveness --json end --session forkloop --terminate | jq -c '{phase, reason}'
    wait "$run" || true
    within 20 no_scope_left
    for pid in $pids; do
        expect "process $pid of the loop is gone" gone "$pid"
    done
    within 10 root_ended forkloop
    local reaped
    # The watcher replays what the daemon keeps, then waits: cut short once replayed.
    reaped=$(timeout 3 liveness --json watch --since 0 --session forkloop | grep -c '"session.reaped"' || true)
    expect "one session.reaped ($reaped)" [ "$reaped" = 1 ]
    expect "status says KillUnit" [ "$(liveness status --json | jq -r .cgroup.termination)" = unit ]
}

# Bursts of scope sessions: 200 registered at once, then their ends at once, then one
# more registration. The daemon's calls in flight on the system bus stay under its 128
# pending replies per connection (`LimitsExceeded` refused registrations' scopes past it),
# and a registration waits for a systemd busy collecting the ended scopes.
scope_count() { [ "$(scope_units | wc -l)" "$1" "$2" ]; }
systemd_scope_burst() {
    local count=200 uid cursor owners=() late said refused warnings
    uid=$(id -u alice)
    for _ in $(seq "$count"); do
        owners+=("$(alice_sleeper)")
    done
    warnings=$(mktemp)
    local began=$SECONDS
    printf '%s\n' "${owners[@]}" |
        xargs -P "$count" -I{} liveness register --uid "$uid" --session burst-{} --owner-pid {} --cgroup \
            2>>"$warnings" >/dev/null
    # The times go to the check's log: a slower machine's failure shows how far it got.
    echo "$count registrations in $((SECONDS - began)) s"
    expect "no registration warned ($(sort "$warnings" | uniq -c | head -n 3))" [ ! -s "$warnings" ]
    expect "a scope each" scope_count -ge "$count"
    cursor=$(journal_cursor)
    kill -KILL "${owners[@]}"
    late=$(alice_sleeper)
    said=$(liveness register --uid "$uid" --session after-burst --owner-pid "$late" --cgroup 2>&1 >/dev/null)
    expect "no warning: the scope after the burst started ($said)" [ -z "$said" ]
    expect "the owner after the burst is in a scope" grep -q '/liveness.slice/liveness-s[0-9-]*\.scope$' "/proc/$late/cgroup"
    kill -KILL "$late"
    within 120 no_scope_left
    echo "every scope gone $((SECONDS - began)) s after the burst began"
    refused=$(messages_since "$cursor" "cannot stop a session's scope")
    expect "no stop refused ($refused)" [ "$refused" = 0 ]
    local ended
    ended=$(as_alice liveness list --phase ended --json | jq '[.[] | select(.id | startswith("burst-"))] | length')
    expect "every burst session ended ($ended)" [ "$ended" = "$count" ]
}

# An end hook as users write them, run by the daemon as alice: it records who it runs as,
# what it may do (its capabilities, a write in its home, a TCP connection to a loopback
# listener from bash and from node, whose JIT needs memory both writable and executable),
# one JSON line per stage in ~alice/hook-runs. With the argument `slow` it waits for
# /tmp/release-SESSION between its start and its end.
hook=/home/alice/end-hook.sh
write_hook() {
    cat >"$hook" <<'HOOK'
#!/bin/bash
set -u
facts=$(cat)
record() {
    jq -nc --arg stage "$1" --argjson facts "$facts" --arg groups "$(id -G)" \
        --arg caps "$(grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status | tr -s '\t\n' '  ')" \
        --arg nnp "$(sed -n 's/^NoNewPrivs:\t//p' /proc/self/status)" \
        --arg bash_tcp "$bash_tcp" --arg node_tcp "$node_tcp" --arg id_u "$(id -u)" --arg id_g "$(id -g)" \
        '{stage: $stage, session: $facts.session, resumed: ($facts.action.resumed // false),
          env_resumed: (env.LIVENESS_RESUMED // ""), uid: env.LIVENESS_UID,
          $id_u, $id_g, $groups, $caps, $nnp, $bash_tcp, $node_tcp}' \
        >>"$HOME/hook-runs"
}
bash_tcp=$( (exec 4<>/dev/tcp/127.0.0.1/7777 && head -n 1 <&4) 2>&1)
node_tcp=$(node -e 'const s = require("net").connect(7777, "127.0.0.1");
    s.on("data", (d) => { process.stdout.write(d.toString().trim()); s.destroy(); });' 2>&1)
record started
if [ "${1:-}" = slow ]; then
    while [ ! -e "/tmp/release-$LIVENESS_SESSION" ]; do sleep 0.1; done
fi
record finished
[ "$bash_tcp" = "$TOKEN" ] && [ "$node_tcp" = "$TOKEN" ]
HOOK
    chown alice: "$hook"
    chmod 0755 "$hook"
}

# A loopback listener, outside the unit: each connection reads the token, which the next
# check finds in /tmp/hook.env with the listener's pid.
start_listener() {
    local token
    token=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
    node -e 'require("net").createServer((c) => c.end(process.argv[1] + "\n")).listen(7777, "127.0.0.1")' \
        "$token" >/dev/null 2>&1 &
    echo "token=$token listener=$!" >/tmp/hook.env
    # node's start under emulation, on a loaded host, has taken over 10 s.
    within 60 bash -c 'exec 4<>/dev/tcp/127.0.0.1/7777'
}

# The records of SESSION's runs at STAGE.
runs() { jq -c --arg s "$1" --arg stage "$2" 'select(.session == $s and .stage == $stage)' /home/alice/hook-runs 2>/dev/null || true; }
runs_count() { runs "$1" "$2" | wc -l; }
runs_are() { [ "$(runs_count "$1" "$2")" = "$3" ]; }
# session.action events of SESSION in the whole log.
action_events() {
    timeout 5 liveness --json watch --since 0 --uid "$(id -u alice)" --session "$1" |
        jq -c 'select(.event.kind == "session.action")' || true
}

end_action_as_user() {
    # A supplementary group, so that "its groups" means more than its primary one.
    groupadd -f hookers
    usermod -aG hookers alice
    rm -f /home/alice/hook-runs
    write_hook
    start_listener
    # shellcheck source=/dev/null
    . /tmp/hook.env
    # The control: under MemoryDenyWriteExecute=yes, which the unit no longer sets, node
    # cannot run at all.
    if systemd-run --wait --quiet --pipe -p MemoryDenyWriteExecute=yes node -e 'console.log(1)'; then
        echo "node ran with MemoryDenyWriteExecute=yes: the check below would prove nothing" >&2
        exit 1
    fi
    local owner code=0 record outcome
    owner=$(alice_sleeper)
    (cd /home/alice && as_alice liveness register --session hooked --owner-pid "$owner" \
        --on-end-run "TOKEN=$token $hook")
    kill -KILL "$owner"
    timeout 60 liveness wait --finalized --uid "$(id -u alice)" --session hooked || code=$?
    expect "wait --finalized says killed by a signal" [ "$code" = 2 ]
    # Nothing runs it a second time.
    sleep 2
    runs hooked started
    record=$(runs hooked finished)
    outcome=$(liveness get --uid "$(id -u alice)" --session hooked --json | jq -c '.actions[0].outcome')
    echo "outcome: $outcome"
    expect "one run, to its end" [ "$(runs_count hooked started)$(runs_count hooked finished)" = 11 ]
    expect "one outcome event" [ "$(action_events hooked | wc -l)" = 1 ]
    expect "exit 0, not resumed" jq -e '.exit.code == 0 and (.resumed // false) == false' <<<"$outcome"
    expect "alice's uid and gid" jq -e --arg u "$(id -u alice)" --arg g "$(id -g alice)" \
        '.id_u == $u and .id_g == $g and .uid == $u' <<<"$record"
    expect "alice's groups ($(id -G alice))" \
        [ "$(jq -r .groups <<<"$record" | tr ' ' '\n' | sort -n | xargs)" = "$(id -G alice | tr ' ' '\n' | sort -n | xargs)" ]
    expect "no capabilities" jq -e '.caps | test("^CapInh: 0+ CapPrm: 0+ CapEff: 0+ CapAmb: 0+ ?$")' <<<"$record"
    expect "no_new_privs" jq -e '.nnp == "1"' <<<"$record"
    expect "its home writable: the record is alice's" [ "$(stat -c %U /home/alice/hook-runs)" = alice ]
    expect "bash reached the loopback listener" jq -e --arg t "$token" '.bash_tcp == $t' <<<"$record"
    expect "node ran and reached it" jq -e --arg t "$token" '.node_tcp == $t' <<<"$record"
}

# An action running when the daemon is restarted is cut short with it (the stop ends the
# unit's processes) and runs again at the start, marked resumed; one outcome in all.
end_action_survives_restart() {
    local owner pid outcome
    # shellcheck source=/dev/null
    . /tmp/hook.env
    rm -f /tmp/release-slow
    owner=$(alice_sleeper)
    (cd /home/alice && as_alice liveness register --session slow --owner-pid "$owner" \
        --on-end-run "TOKEN=$token $hook slow" --on-end-timeout 2m)
    kill -KILL "$owner"
    within 30 runs_are slow started 1
    pid=$(main_pid)
    systemctl restart livenessd
    expect "a new daemon" [ "$(main_pid)" != "$pid" ]
    if ! within 30 runs_are slow started 2; then
        liveness get --uid "$(id -u alice)" --session slow --json | jq -c '{phase, actions}'
        journalctl -u livenessd -n 30 -o cat
        exit 1
    fi
    runs slow started
    expect "the first run did not finish" [ "$(runs_count slow finished)" = 0 ]
    expect "the second run is marked resumed" \
        jq -se '.[0].resumed == false and .[1].resumed == true and .[1].env_resumed == "1"' <<<"$(runs slow started)"
    touch /tmp/release-slow
    timeout 60 liveness wait --finalized --uid "$(id -u alice)" --session slow || true
    sleep 2
    outcome=$(liveness get --uid "$(id -u alice)" --session slow --json | jq -c '.actions[0].outcome')
    echo "outcome: $outcome"
    expect "finished once" [ "$(runs_count slow finished)" = 1 ]
    expect "exit 0, resumed" jq -e '.exit.code == 0 and .resumed == true' <<<"$outcome"
    expect "one outcome event" [ "$(action_events slow | wc -l)" = 1 ]
    kill "$listener"
}

security_exposure() {
    local report score
    report=$(systemd-analyze security --no-pager livenessd)
    echo "$report"
    score=$(sed -n 's/.*Overall exposure level for livenessd.service: \([0-9.]*\).*/\1/p' <<<"$report")
    expect "a score" [ -n "$score" ]
    fact exposure "$score"
}

# The drop-in of docs/install.md (on the payload disk) serves the metrics on the loopback
# interface; without it the unit allows no network at all.
metrics_drop_in() {
    local dir=/etc/systemd/system/livenessd.service.d reply
    mkdir -p "$dir"
    cp /payload/metrics.conf "$dir/metrics.conf"
    systemctl daemon-reload
    systemctl restart livenessd
    reply=$(
        exec 4<>/dev/tcp/127.0.0.1/9464
        printf 'GET /metrics HTTP/1.0\r\n\r\n' >&4
        cat <&4
    )
    grep liveness_source_up <<<"$reply"
    expect "the eBPF source up" grep -q 'liveness_source_up{source="ebpf"} 1' <<<"$reply"
    rm -r "$dir"
    systemctl daemon-reload
    systemctl restart livenessd
}

remove_keeps_state() {
    local head
    head=$(liveness status --json | jq .head_seq)
    apt-get remove -y liveness
    expect "stopped" [ "$(systemctl is-active livenessd)" != active ]
    expect "the binaries gone" [ ! -e /usr/bin/livenessd ]
    expect "the database kept" [ -f /var/lib/liveness/liveness.db ]
    expect "the pinned lineage programs removed" [ ! -e /sys/fs/bpf/liveness ]
    # Installed again, the daemon finds everything where it was.
    dpkg -i "$new_deb"
    expect "started again" active
    expect "lineage programs pinned again" lineage_pinned
    expect "the events kept" [ "$(liveness status --json | jq .head_seq)" = "$head" ]
    expect "an ended session kept" ended crashed
}

purge_removes_state() {
    apt-get purge -y liveness
    expect "stopped" [ "$(systemctl is-active livenessd)" != active ]
    expect "the state gone" [ ! -e /var/lib/liveness ]
    expect "no unit link left" [ -z "$(find /etc/systemd/system -name 'livenessd*')" ]
}

# As in a container or WSL without systemd: /run/systemd/system is absent. The package
# enables the unit for a later boot with systemd, starts nothing and says how to run
# the daemon. The daemon started so, by hand, is stopped by a purge before its state goes.
without_systemd() {
    local said daemon
    said=$(unshare --mount sh -c "mount -t tmpfs none /run/systemd && dpkg -i $new_deb" 2>&1)
    echo "$said"
    expect "says how to run the daemon" grep -q 'Start it as root' <<<"$said"
    expect "started nothing" [ "$(systemctl is-active livenessd)" != active ]
    nohup livenessd >/tmp/by-hand.log 2>&1 &
    daemon=$!
    within 30 liveness status >/dev/null
    said=$(apt-get purge -y liveness 2>&1)
    echo "$said"
    expect "says it stops the daemon started by hand" grep -q "stopping livenessd started by hand (pid $daemon)" <<<"$said"
    expect "the daemon started by hand stopped" wait "$daemon"
    expect "it stopped cleanly, not for a deleted database" grep -q 'stopped$' /tmp/by-hand.log
    expect "the state gone" [ ! -e /var/lib/liveness ]
}

# The previous release, as its users ran it (its package started nothing: they ran
# `systemctl enable --now livenessd`), with sessions, a lock and a consumer's cursor.
previous_release() {
    rm -f /tmp/handled /tmp/cursor
    dpkg -i "$previous_deb"
    fact previous_version "$(dpkg-query -W -f '${Version}' liveness)"
    systemctl daemon-reload
    systemctl enable --now livenessd
    within 30 liveness status >/dev/null
    first=$(alice_sleeper)
    second=$(alice_sleeper)
    as_alice liveness register --session up-1 --owner-pid "$first"
    as_alice liveness register --session up-2 --owner-pid "$second"
    as_alice liveness lock acquire deploy --session up-2 >/tmp/token
    "${alice[@]}" liveness watch --exec 'echo "$LIVENESS_SESSION" >>/tmp/handled' --cursor /tmp/cursor &
    local watcher=$!
    # Without a cursor yet, the watcher follows from when it subscribes.
    within 20 subscribed
    kill -KILL "$first"
    within 20 grep -qx up-1 /tmp/handled
    # The watcher saves its cursor once the command has returned: stopped before that, it
    # would leave none, and the next one would follow from its own start, past up-2's end.
    within 20 test -s /tmp/cursor
    kill "$watcher"
    wait "$watcher" || true
    echo "second=$second" >/tmp/upgrade.env
}

upgrade_restarts_once() {
    local cursor pid
    cursor=$(journal_cursor)
    pid=$(main_pid)
    dpkg -i "$new_deb"
    fact upgraded_to "$(dpkg-query -W -f '${Version}' liveness)"
    expect "running" active
    expect "a new daemon" [ "$(main_pid)" != "$pid" ]
    expect "stopped once" [ "$(messages_since "$cursor" stopped)" = 1 ]
    expect "started once" [ "$(messages_since "$cursor" "livenessd listening")" = 1 ]
    expect "enabled, the package's choice from now on" [ "$(systemctl is-enabled livenessd)" = enabled ]
}

upgrade_kept_everything() {
    # shellcheck source=/dev/null
    . /tmp/upgrade.env
    local token
    token=$(cat /tmp/token)
    expect "the ended session kept" ended up-1
    expect "the active session still active" [ "$(phase up-2)" = active ]
    expect "the lock still held, with its token" \
        as_alice sh -c "liveness lock list --json | jq -e '.[] | select(.name == \"deploy\") | .session == \"up-2\" and .token == $token'"
    kill -KILL "$second"
    within 10 ended up-2
    # The consumer resumes after its cursor: up-2 handled, up-1 not again.
    "${alice[@]}" liveness watch --exec 'echo "$LIVENESS_SESSION" >>/tmp/handled' --cursor /tmp/cursor &
    local watcher=$!
    if ! within 20 grep -qx up-2 /tmp/handled; then
        echo "cursor: $(cat /tmp/cursor), handled: $(tr '\n' ' ' </tmp/handled)"
        ls -l /tmp/handled /tmp/cursor*
        ps -o pid,user,stat,args -p "$watcher" || true
        timeout 5 liveness --json watch --since 0 | jq -c '.event | {seq, kind, session, creator_uid}' || true
        journalctl -u livenessd -n 20 -o cat
        exit 1
    fi
    kill "$watcher"
    wait "$watcher" || true
    cat /tmp/handled
    expect "each end handled once" [ "$(tr '\n' ' ' </tmp/handled)" = "up-1 up-2 " ]
    local owner next
    owner=$(alice_sleeper)
    as_alice liveness register --session up-3 --owner-pid "$owner"
    next=$(as_alice liveness lock acquire deploy --session up-3)
    expect "a greater token ($next > $token)" [ "$next" -gt "$token" ]
    kill -KILL "$owner"
}

fact kernel "$(uname -r)"
fact systemd "$(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p')"
fact pid1 "$(cat /proc/1/comm)"
systemctl is-system-running --wait >/dev/null || true

check "fresh install: the package enables and starts livenessd" fresh_install
check "status as root: eBPF and pidfd active in the sandbox" status_as_root
check "status as a user: the same, through the same socket" status_as_user
check "an owner killed with SIGKILL ends its session" sigkill_ends_session
check "journal: one entry per registration and end, with fields" journal_fields
check "end policy terminates a user's leftover process" reap_in_sandbox
check "systemctl restart loses nothing (sessions, lock, token)" restart_loses_nothing
check "systemctl kill -s KILL: restarted, reconcile ends the dead" crash_restart_reconciles
check "end action of a user: as the user, no caps, home, network, node" end_action_as_user
check "end action cut short by systemctl restart runs again, resumed" end_action_survives_restart
check "systemd-analyze security livenessd" security_exposure
check "metrics drop-in of docs/install.md: served on 127.0.0.1" metrics_drop_in
check "cgroup: status says systemd; a user's session gets its scope" systemd_scope_shipped_unit
check "cgroup: a transient scope under liveness.slice, MemoryMax, gone at the end" systemd_scope
check "cgroup: a 64M hog is OOM-killed in its scope, oom_kill counted" systemd_scope_hog
check "cgroup: a daemon SIGKILLed with a scope session: no scope outlives it" systemd_scope_after_crash
check "cgroup: a leftover liveness-* scope is listed from systemd at start and killed" systemd_leftover_scope
check "cgroup: end --terminate of a fork loop under TasksMax: KillUnit leaves nothing" systemd_scope_terminate_fork_loop
check "cgroup: 200 scope sessions start at once, end at once; the next scope starts" systemd_scope_burst
check "apt-get remove stops the daemon and keeps the state" remove_keeps_state
check "apt-get purge removes /var/lib/liveness" purge_removes_state
check "without systemd as init: starts nothing, says how to run" without_systemd
check "previous release running: sessions, lock, consumer cursor" previous_release
check "upgrade: the daemon restarts once" upgrade_restarts_once
check "upgrade kept sessions, lock, token, events, cursor" upgrade_kept_everything
echo VMDONE
