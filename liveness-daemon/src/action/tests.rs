//! The runner for real: actions run as root's tests, as an unprivileged uid with chosen
//! groups, and report what the kernel says of them (`/proc/self/status`, their descriptors,
//! environment and stdin) through the stderr tail of their outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use liveness_common::action::{ActionOutcome, ActionRun, ActionSpec, EndFacts, STDERR_TAIL_BYTES};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::Identity;
use liveness_common::session::{EndReason, Survivors};
use liveness_proc::identity::ProcRoot;

use super::RunOptions;
use super::runner::{ActionRunner, run_action};
use super::user::RunAs;
use crate::source::testutil::root;

/// An unprivileged user with supplementary groups of its own, whatever the databases of
/// the machine say (a root daemon sets exactly the ids it resolved).
fn nobody() -> RunAs {
    RunAs {
        uid: 65_534,
        gid: 65_534,
        groups: vec![4_242, 65_533, 65_534],
        name: "liveness-test".into(),
        home: PathBuf::from("/"),
        shell: PathBuf::from("/bin/sh"),
    }
}

fn facts() -> EndFacts {
    EndFacts {
        session: "build-7".into(),
        uid: 65_534,
        labels: BTreeMap::from([("tool".into(), "agent x".into())]),
        owner: Identity {
            pid: 4_121,
            start_ticks: 99,
            boot_id: "boot".into(),
            host: "host".into(),
            pidfs_ino: None,
            comm: "agent".into(),
        },
        reason: EndReason::OwnerExited,
        exit: Some(ExitStatus::Exited { code: 3 }),
        detected_by: Some(DetectedBy::Ebpf),
        ended_ms: 1_700_000_000_000,
        cause: None,
        usage: None,
        survivors: Some(Survivors::default()),
        action: ActionRun {
            index: 1,
            resumed: true,
        },
    }
}

fn options() -> RunOptions {
    RunOptions {
        proc: ProcRoot::default(),
        kill_grace: Duration::from_millis(300),
    }
}

fn sh(script: &str) -> ActionSpec {
    ActionSpec::new(["sh", "-c", script])
}

async fn run_as(user: &RunAs, spec: &ActionSpec) -> ActionOutcome {
    run_action(spec, &facts(), user, &options(), |_, release| {
        release_now(release)
    })
    .await
}

/// Lets the action's process run at once (nothing to record here).
fn release_now(release: OwnedFd) {
    super::spawn::release(release).expect("release the action's process");
}

/// Runs a script that must succeed, and returns its stderr.
async fn stderr_of(user: &RunAs, script: &str) -> String {
    let outcome = run_as(user, &sh(script)).await;
    assert!(outcome.succeeded(), "{script}: {outcome:?}");
    outcome.stderr_tail
}

/// The value of a `Name:\tvalue` line of `/proc/<pid>/status`.
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
}

/// A directory that every user may enter, removed on drop.
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// No capability in any set, and `no_new_privs`: what a `/proc/<pid>/status` must say.
fn assert_unprivileged(status: &str) {
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(status, set), "0000000000000000", "{set}");
    }
    assert_eq!(field(status, "NoNewPrivs"), "1");
}

#[tokio::test]
async fn an_action_has_exactly_its_users_ids_and_no_privilege() {
    if !root("an_action_has_exactly_its_users_ids_and_no_privilege") {
        return;
    }
    let status = stderr_of(&nobody(), "cat /proc/self/status >&2").await;
    assert_eq!(field(&status, "Uid"), "65534\t65534\t65534\t65534");
    assert_eq!(field(&status, "Gid"), "65534\t65534\t65534\t65534");
    assert_eq!(field(&status, "Groups"), "4242 65533 65534");
    assert_unprivileged(&status);
}

#[tokio::test]
async fn a_root_session_runs_its_actions_as_root_without_capabilities() {
    if !root("a_root_session_runs_its_actions_as_root_without_capabilities") {
        return;
    }
    let status = stderr_of(&RunAs::unknown(0, 0), "cat /proc/self/status >&2").await;
    assert_eq!(field(&status, "Uid"), "0\t0\t0\t0");
    assert_unprivileged(&status);
}

#[tokio::test]
async fn an_action_can_neither_signal_nor_read_what_its_user_could_not() {
    if !root("an_action_can_neither_signal_nor_read_what_its_user_could_not") {
        return;
    }
    let dir = open_dir();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The action's parent is this test process, which runs as root.
    let script = format!(
        "kill -0 $PPID 2>/dev/null && echo signalled >&2; cat {} 2>/dev/null >&2; echo done >&2",
        secret.display()
    );
    assert_eq!(stderr_of(&nobody(), &script).await, "done\n");
}

#[tokio::test]
async fn an_action_has_a_session_and_process_group_of_its_own_and_no_terminal() {
    if !root("an_action_has_a_session_and_process_group_of_its_own_and_no_terminal") {
        return;
    }
    let stat = stderr_of(&nobody(), "cat /proc/$$/stat >&2").await;
    let (pid, rest) = stat.split_once(' ').unwrap();
    // After the command name: state, ppid, pgrp, session, tty_nr.
    let fields: Vec<&str> = rest.rsplit_once(") ").unwrap().1.split(' ').collect();
    assert_eq!(fields[2], pid, "process group");
    assert_eq!(fields[3], pid, "session");
    assert_eq!(fields[4], "0", "controlling terminal");
}

#[tokio::test]
async fn no_descriptor_of_the_daemon_reaches_an_action() {
    if !root("no_descriptor_of_the_daemon_reaches_an_action") {
        return;
    }
    // A descriptor without close-on-exec, as a careless library might leave one.
    let leaked: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    rustix::io::fcntl_setfd(&leaked, rustix::io::FdFlags::empty()).unwrap();
    // `ls` of its own descriptors: exec'd with its output moved for good, so no shell keeps
    // a saved copy; the one `ls` opens to read the listing is named for what it is.
    let listing = stderr_of(&nobody(), "exec ls -l /proc/self/fd 1>&2").await;
    drop(leaked);
    let fds: Vec<(&str, &str)> = listing
        .lines()
        .filter_map(|line| {
            let (name, target) = line.split_once(" -> ")?;
            Some((name.rsplit(' ').next()?, target))
        })
        .filter(|(_, target)| !(target.starts_with("/proc/") && target.ends_with("/fd")))
        .collect();
    let numbers: Vec<&str> = fds.iter().map(|(fd, _)| *fd).collect();
    assert_eq!(numbers, ["0", "1", "2"], "{listing}");
    assert!(
        fds[0].1.starts_with("/memfd:liveness-end-facts"),
        "{listing}"
    );
    assert!(
        fds[1].1.starts_with("pipe:"),
        "stdout moved onto stderr: {listing}"
    );
    assert!(fds[2].1.starts_with("pipe:"), "{listing}");
}

#[tokio::test]
async fn an_action_gets_a_clean_environment_with_the_end_facts() {
    if !root("an_action_gets_a_clean_environment_with_the_end_facts") {
        return;
    }
    let mut spec = sh("tr '\\0' '\\n' </proc/$$/environ >&2");
    spec.env = vec!["EXTRA=a=b".into(), "PATH=/usr/bin:/bin".into()];
    let outcome = run_as(&nobody(), &spec).await;
    assert!(outcome.succeeded(), "{outcome:?}");
    let env: BTreeMap<&str, &str> = outcome
        .stderr_tail
        .lines()
        .map(|line| line.split_once('=').unwrap())
        .collect();
    let expected = BTreeMap::from([
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/"),
        ("USER", "liveness-test"),
        ("LOGNAME", "liveness-test"),
        ("SHELL", "/bin/sh"),
        ("LANG", "C.UTF-8"),
        ("EXTRA", "a=b"),
        ("LIVENESS_SESSION", "build-7"),
        ("LIVENESS_UID", "65534"),
        ("LIVENESS_REASON", "owner_exited"),
        ("LIVENESS_OWNER_PID", "4121"),
        ("LIVENESS_ENDED_MS", "1700000000000"),
        ("LIVENESS_LABELS", r#"{"tool":"agent x"}"#),
        ("LIVENESS_ACTION_INDEX", "1"),
        ("LIVENESS_EXIT_CODE", "3"),
        ("LIVENESS_DETECTED_BY", "ebpf"),
        ("LIVENESS_SURVIVORS", "0"),
        ("LIVENESS_RESUMED", "1"),
    ]);
    assert_eq!(env, expected, "nothing of the daemon's environment passes");
}

#[tokio::test]
async fn an_action_reads_the_end_facts_as_json_on_stdin() {
    if !root("an_action_reads_the_end_facts_as_json_on_stdin") {
        return;
    }
    let json = stderr_of(&nobody(), "cat >&2").await;
    let read: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(read, serde_json::to_value(facts()).unwrap());
}

#[tokio::test]
async fn an_action_runs_in_its_directory_or_its_users_home() {
    if !root("an_action_runs_in_its_directory_or_its_users_home") {
        return;
    }
    let dir = open_dir();
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    let mut spec = sh("pwd -P >&2");
    spec.cwd = Some(cwd.display().to_string());
    let outcome = run_as(&nobody(), &spec).await;
    assert_eq!(outcome.stderr_tail.trim_end(), cwd.display().to_string());
    let home = RunAs {
        home: cwd.clone(),
        ..nobody()
    };
    assert_eq!(
        stderr_of(&home, "pwd -P >&2").await.trim_end(),
        cwd.display().to_string()
    );
}

#[tokio::test]
async fn a_directory_the_user_cannot_enter_fails_clearly() {
    if !root("a_directory_the_user_cannot_enter_fails_clearly") {
        return;
    }
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut spec = sh("echo ran >&2");
    spec.cwd = Some(private.path().display().to_string());
    let outcome = run_as(&nobody(), &spec).await;
    assert_eq!(outcome.exit, None, "it never ran: {outcome:?}");
    let error = outcome.error.unwrap();
    assert!(
        error.contains("could not enter its working directory as uid 65534")
            && error.contains(&private.path().display().to_string())
            && error.contains("Permission denied"),
        "{error}"
    );
}

#[tokio::test]
async fn a_program_that_cannot_be_run_fails_clearly() {
    if !root("a_program_that_cannot_be_run_fails_clearly") {
        return;
    }
    let outcome = run_as(&nobody(), &ActionSpec::new(["/nonexistent/cleanup"])).await;
    let error = outcome.error.unwrap();
    assert!(
        error.contains("cannot run \"/nonexistent/cleanup\"") && error.contains("No such file"),
        "{error}"
    );
    let found = run_as(&nobody(), &ActionSpec::new(["true"])).await;
    assert!(found.succeeded(), "a bare name is found in PATH: {found:?}");
}

#[tokio::test]
async fn a_failing_action_leaves_its_status_and_the_tail_of_its_stderr() {
    if !root("a_failing_action_leaves_its_status_and_the_tail_of_its_stderr") {
        return;
    }
    let outcome = run_as(
        &nobody(),
        &sh("head -c 10000 /dev/zero | tr '\\0' a >&2; echo END >&2; exit 3"),
    )
    .await;
    assert_eq!(outcome.exit, Some(ExitStatus::Exited { code: 3 }));
    assert!(!outcome.succeeded() && !outcome.timed_out);
    assert_eq!(outcome.stderr_bytes, 10_004);
    assert_eq!(outcome.stderr_tail.len(), STDERR_TAIL_BYTES);
    assert!(outcome.stderr_tail.ends_with("aaaEND\n"), "{outcome:?}");

    let flood = run_as(&nobody(), &sh("head -c 50000000 /dev/zero >&2")).await;
    assert!(flood.succeeded(), "{flood:?}");
    assert_eq!(flood.stderr_bytes, 50_000_000, "all read, the tail kept");
    assert_eq!(flood.stderr_tail.len(), STDERR_TAIL_BYTES);
}

/// A process that is gone, or a zombie (init reaps orphans lazily), or no longer ours.
fn is_ended(proc: &ProcRoot, pid: u32, marker: &str) -> bool {
    proc.stat(pid).map_or(true, |stat| stat.has_exited())
        || !proc
            .cmdline(pid)
            .is_ok_and(|args| args.iter().any(|arg| arg == marker))
}

/// `name pid` lines of an outcome's stderr.
fn pids(outcome: &ActionOutcome) -> BTreeMap<String, u32> {
    outcome
        .stderr_tail
        .lines()
        .filter_map(|line| {
            let (name, pid) = line.split_once(' ')?;
            Some((name.to_owned(), pid.parse().ok()?))
        })
        .collect()
}

/// The root of the tree: survives SIGTERM (a handler, so its children may have their own)
/// and stays the subreaper of its tree until SIGKILL.
const TREE_ROOT: &str = "trap : TERM
sh child.sh & echo child $! >&2
(setsid sh -c \"trap '' TERM; exec sleep 1003\" & echo orphan $! >&2)
while :; do wait; done
";

/// Its child: a grandchild that ignores SIGTERM, one that also left the process group,
/// and, on SIGTERM, a late one that leaves the group too.
const TREE_CHILD: &str = "trap 'setsid sleep 1005 & echo late $! >&2' TERM
(trap '' TERM; exec sleep 1001) & echo grandchild $! >&2
setsid sh -c \"trap '' TERM; exec sleep 1002\" & echo left-group $! >&2
while :; do wait; done
";

#[tokio::test]
async fn the_timeout_ends_the_whole_tree_also_what_left_its_group() {
    if !root("the_timeout_ends_the_whole_tree_also_what_left_its_group") {
        return;
    }
    // What each process escapes without a part of the runner: the orphan, init's child
    // outside the group without the action being its tree's subreaper; the late one,
    // forked during the grace outside the group, without the walk after SIGSTOP.
    let dir = open_dir();
    std::fs::write(dir.path().join("root.sh"), TREE_ROOT).unwrap();
    std::fs::write(dir.path().join("child.sh"), TREE_CHILD).unwrap();
    let mut spec = ActionSpec::new(["sh", "root.sh"]);
    spec.cwd = Some(dir.path().display().to_string());
    spec.timeout_ms = Some(1_000);
    let outcome = run_as(&nobody(), &spec).await;
    assert!(outcome.timed_out, "{outcome:?}");
    assert_eq!(
        outcome.exit,
        Some(ExitStatus::Signaled {
            signal: libc::SIGKILL as u8,
            core_dumped: false
        })
    );
    assert!(
        (1_300..6_000).contains(&outcome.duration_ms),
        "the timeout, the grace, then the kill: {outcome:?}"
    );
    let pids = pids(&outcome);
    let names: BTreeSet<&str> = pids.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from(["child", "grandchild", "late", "left-group", "orphan"]),
        "{outcome:?}"
    );
    assert!(outcome.killed >= 6, "the action and its five: {outcome:?}");
    let proc = ProcRoot::default();
    for (name, marker) in [
        ("grandchild", "1001"),
        ("left-group", "1002"),
        ("orphan", "1003"),
        ("late", "1005"),
    ] {
        let pid = pids[name];
        assert!(
            eventually(|| is_ended(&proc, pid, marker)).await,
            "{name} {pid} survived the timeout"
        );
    }
    assert!(
        eventually(|| proc
            .stat(pids["child"])
            .map_or(true, |stat| stat.has_exited()))
        .await,
        "the child survived the timeout"
    );
}

#[tokio::test]
async fn a_finished_action_is_not_held_by_what_it_left_running() {
    if !root("a_finished_action_is_not_held_by_what_it_left_running") {
        return;
    }
    // The background process keeps stderr open; the action is done when its process is.
    let outcome = run_as(
        &nobody(),
        &sh("sleep 1004 & echo left $! >&2; echo done >&2"),
    )
    .await;
    assert!(
        outcome.succeeded() && outcome.duration_ms < 5_000,
        "{outcome:?}"
    );
    assert!(outcome.stderr_tail.ends_with("done\n"), "{outcome:?}");
    let left = pids(&outcome)["left"];
    let proc = ProcRoot::default();
    let left_alone = eventually(|| !is_ended(&proc, left, "1004")).await;
    if left_alone {
        // SAFETY: signalling the sleep this test started, checked by its command line.
        unsafe { libc::kill(left as i32, libc::SIGKILL) };
    }
    assert!(left_alone, "what it left running is left alone");
}

#[tokio::test]
async fn the_runner_looks_up_the_creator_and_runs_as_it() {
    if !root("the_runner_looks_up_the_creator_and_runs_as_it") {
        return;
    }
    let runner = ActionRunner::new(options());
    // A uid no database knows, with the group it registered with.
    let uid = u32::MAX - 1;
    let facts = EndFacts { uid, ..facts() };
    let mut root = None;
    let spec = sh("cat /proc/self/status >&2");
    let outcome = runner
        .run(&spec, &facts, Some(4_343), |key, release| {
            root = Some(key);
            release_now(release);
        })
        .await;
    let root = root.expect("the runner names the action's first process");
    assert!(root.pid > 0 && root.start_ticks > 0, "{root:?}");
    assert!(outcome.succeeded(), "{outcome:?}");
    assert_eq!(
        field(&outcome.stderr_tail, "Uid"),
        format!("{uid}\t{uid}\t{uid}\t{uid}")
    );
    assert_eq!(field(&outcome.stderr_tail, "Gid"), "4343\t4343\t4343\t4343");
    assert_eq!(field(&outcome.stderr_tail, "Groups"), "");
    assert_eq!((outcome.index, outcome.resumed), (1, true));
}

/// Polls `condition` for up to 10 s.
async fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..1_000 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}
