//! Every exit source, forced alone and in `auto`, against real processes that are not the
//! test's children, in the real kernel.

use std::collections::HashSet;
use std::time::Duration;

use integration_tests::{Orphan, OrphanGroup, eventually, privileged, state};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, ProcessKey};
use liveness_common::status::SourceName;
use liveness_daemon::EbpfConfig;
use liveness_daemon::ExitObservation;
use liveness_daemon::{Monitor, MonitorConfig};

/// How long a death may take to arrive before the test fails (generous: shared machines).
const ARRIVAL: Duration = Duration::from_secs(10);
/// How long the test waits to be sure that nothing (more) arrives: many poll intervals.
const QUIET: Duration = Duration::from_millis(400);

/// The selections under test; eBPF ones only where privileges allow.
fn selections(test: &str) -> Vec<&'static str> {
    let mut selections = vec!["pidfd", "procpoll"];
    if privileged(test) {
        selections.extend(["ebpf", "auto"]);
    }
    selections
}

async fn monitor(selection: &str) -> Monitor {
    Monitor::start(MonitorConfig {
        selection: selection.parse().unwrap(),
        procpoll_interval: Duration::from_millis(20),
        ..MonitorConfig::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{selection}: monitor does not start: {e}"))
}

async fn next_within(monitor: &mut Monitor, timeout: Duration) -> Option<ExitObservation> {
    tokio::time::timeout(timeout, monitor.next()).await.ok()
}

async fn expect_exit(monitor: &mut Monitor, selection: &str, key: ProcessKey) -> ExitObservation {
    let observation = next_within(monitor, ARRIVAL)
        .await
        .unwrap_or_else(|| panic!("{selection}: no observation of {key} within {ARRIVAL:?}"));
    assert_eq!(
        observation.key, key,
        "{selection}: observed another process"
    );
    assert_eq!(observation.reason, DeathReason::Exited, "{selection}");
    observation
}

async fn expect_quiet(monitor: &mut Monitor, selection: &str, what: &str) {
    if let Some(observation) = next_within(monitor, QUIET).await {
        panic!("{selection}: {what}, yet observed {observation:?}");
    }
}

/// One observation for each of `expected`, in the order they came; fails on a missing,
/// foreign or repeated one.
async fn expect_each_once(
    monitor: &mut Monitor,
    selection: &str,
    expected: &HashSet<ProcessKey>,
) -> Vec<ExitObservation> {
    let mut seen = HashSet::new();
    let mut observations = Vec::new();
    while seen.len() < expected.len() {
        let observation = next_within(monitor, ARRIVAL).await.unwrap_or_else(|| {
            panic!(
                "{selection}: only {} of {} deaths observed",
                seen.len(),
                expected.len()
            )
        });
        assert!(
            expected.contains(&observation.key),
            "{selection}: unexpected {:?}",
            observation.key
        );
        assert!(
            seen.insert(observation.key),
            "{selection}: {} observed twice",
            observation.key
        );
        observations.push(observation);
    }
    observations
}

fn key(orphan: &Orphan) -> ProcessKey {
    ProcessKey {
        pid: orphan.pid,
        start_ticks: orphan.start_ticks,
    }
}

/// The status a source must report: eBPF always knows it; pidfd may (Linux 6.15+, once
/// the process is reaped); the /proc poller never does.
fn assert_status(selection: &str, observation: &ExitObservation, expected: ExitStatus) {
    match observation.detected_by {
        DetectedBy::Ebpf => assert_eq!(
            observation.status,
            Some(expected),
            "{selection}: eBPF status"
        ),
        DetectedBy::Pidfd => assert!(
            observation.status.is_none() || observation.status == Some(expected),
            "{selection}: pidfd status {:?}, expected {expected:?} or none",
            observation.status
        ),
        DetectedBy::Procpoll => assert_eq!(observation.status, None, "{selection}"),
        DetectedBy::Reconcile => {
            panic!("{selection}: a live process was reported dead at track time")
        }
    }
    let expected_source = match selection {
        "ebpf" => Some(DetectedBy::Ebpf),
        "pidfd" => Some(DetectedBy::Pidfd),
        "procpoll" => Some(DetectedBy::Procpoll),
        _ => None,
    };
    if let Some(source) = expected_source {
        assert_eq!(observation.detected_by, source, "{selection}: wrong source");
    }
}

#[tokio::test]
async fn exit_code_of_a_non_child_is_observed_once() {
    for selection in selections("exit_code_of_a_non_child_is_observed_once") {
        let mut monitor = monitor(selection).await;
        let mut orphan = Orphan::spawn(&["exit", "7"]);
        assert_eq!(
            monitor.track(key(&orphan)),
            None,
            "{selection}: a live process is not dead"
        );
        expect_quiet(&mut monitor, selection, "the process is alive").await;
        orphan.release();
        let observation = expect_exit(&mut monitor, selection, key(&orphan)).await;
        assert_status(selection, &observation, ExitStatus::Exited { code: 7 });
        expect_quiet(&mut monitor, selection, "the death was already reported").await;
        assert_eq!(
            monitor.status().tracked,
            0,
            "{selection}: a dead process stays tracked"
        );
    }
}

#[tokio::test]
async fn death_by_sigkill_reports_the_signal() {
    for selection in selections("death_by_sigkill_reports_the_signal") {
        let mut monitor = monitor(selection).await;
        let orphan = Orphan::spawn(&["exit", "0"]);
        assert_eq!(monitor.track(key(&orphan)), None);
        // SAFETY: killing the orphan this test started.
        unsafe { libc::kill(orphan.pid as i32, libc::SIGKILL) };
        let observation = expect_exit(&mut monitor, selection, key(&orphan)).await;
        assert_status(
            selection,
            &observation,
            ExitStatus::Signaled {
                signal: 9,
                core_dumped: false,
            },
        );
    }
}

#[tokio::test]
async fn main_thread_exit_is_not_process_exit() {
    for selection in selections("main_thread_exit_is_not_process_exit") {
        let mut monitor = monitor(selection).await;
        let mut orphan = Orphan::spawn(&["threads", "5"]);
        let leader = format!("/proc/{0}/task/{0}/stat", orphan.pid);
        let leader_exited = eventually(ARRIVAL, || {
            std::fs::read_to_string(&leader).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        });
        assert!(
            leader_exited,
            "{selection}: the main thread of {} did not exit",
            orphan.pid
        );
        assert_eq!(
            monitor.track(key(&orphan)),
            None,
            "{selection}: a process whose main thread exited is alive"
        );
        expect_quiet(&mut monitor, selection, "only the main thread exited").await;
        orphan.release();
        let observation = expect_exit(&mut monitor, selection, key(&orphan)).await;
        assert_status(selection, &observation, ExitStatus::Exited { code: 5 });
    }
}

async fn exec_is_not_exit(mode: &str, test: &str) {
    for selection in selections(test) {
        let mut monitor = monitor(selection).await;
        let mut orphan = Orphan::spawn(&[mode, "3"]);
        assert_eq!(monitor.track(key(&orphan)), None);
        orphan.poke();
        let comm = format!("/proc/{}/comm", orphan.pid);
        let execd = eventually(ARRIVAL, || {
            std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "execd")
        });
        assert!(execd, "{selection}: {} did not exec", orphan.pid);
        assert_eq!(
            integration_tests::start_ticks(orphan.pid),
            Some(orphan.start_ticks),
            "execve keeps the start time, so the fingerprint"
        );
        expect_quiet(&mut monitor, selection, "the process only called execve").await;
        orphan.release();
        let observation = expect_exit(&mut monitor, selection, key(&orphan)).await;
        assert_status(selection, &observation, ExitStatus::Exited { code: 3 });
    }
}

#[tokio::test]
async fn execve_is_not_exit() {
    exec_is_not_exit("exec", "execve_is_not_exit").await;
}

/// A non-leader thread's execve makes the kernel kill the old leader and every other
/// thread (de_thread): many thread exits, still no process exit.
#[tokio::test]
async fn execve_from_a_thread_is_not_exit() {
    exec_is_not_exit("thread-exec", "execve_from_a_thread_is_not_exit").await;
}

#[tokio::test]
async fn two_hundred_simultaneous_exits_are_each_observed_once() {
    for selection in selections("two_hundred_simultaneous_exits_are_each_observed_once") {
        let mut monitor = monitor(selection).await;
        let mut group = OrphanGroup::spawn(200, &["exit", "1"]);
        let expected: HashSet<ProcessKey> = group
            .members
            .iter()
            .map(|&(pid, start_ticks)| ProcessKey { pid, start_ticks })
            .collect();
        for &key in &expected {
            assert_eq!(monitor.track(key), None, "{selection}: {key} is alive");
        }
        group.release();
        for observation in expect_each_once(&mut monitor, selection, &expected).await {
            assert_status(selection, &observation, ExitStatus::Exited { code: 1 });
        }
        expect_quiet(
            &mut monitor,
            selection,
            "all 200 deaths were already reported",
        )
        .await;
    }
}

#[tokio::test]
async fn untracked_exits_are_not_observed() {
    for selection in selections("untracked_exits_are_not_observed") {
        let mut monitor = monitor(selection).await;
        let tracked = Orphan::spawn(&["exit", "0"]);
        assert_eq!(monitor.track(key(&tracked)), None);
        let mut untracked = Orphan::spawn(&["exit", "0"]);
        untracked.release();
        assert!(
            eventually(ARRIVAL, || state(untracked.pid).is_none_or(|s| s == 'Z')),
            "untracked did not exit"
        );
        expect_quiet(&mut monitor, selection, "only an untracked process exited").await;
    }
}

#[tokio::test]
async fn a_dead_or_reused_pid_is_reported_dead_at_track() {
    for selection in selections("a_dead_or_reused_pid_is_reported_dead_at_track") {
        let mut monitor = monitor(selection).await;
        let mut dead = Orphan::spawn(&["exit", "0"]);
        dead.release();
        assert!(
            eventually(ARRIVAL, || state(dead.pid).is_none_or(|s| s == 'Z')),
            "orphan did not exit"
        );
        let observation = monitor
            .track(key(&dead))
            .unwrap_or_else(|| panic!("{selection}: dead PID tracked as alive"));
        assert_eq!(
            (observation.reason, observation.detected_by),
            (DeathReason::Exited, DetectedBy::Reconcile)
        );

        // The PID is alive, but with another start time: a different process holds it.
        let alive = Orphan::spawn(&["exit", "0"]);
        let reused = ProcessKey {
            pid: alive.pid,
            start_ticks: alive.start_ticks - 1,
        };
        let observation = monitor
            .track(reused)
            .unwrap_or_else(|| panic!("{selection}: reused PID tracked as alive"));
        assert_eq!(observation.reason, DeathReason::PidReused, "{selection}");
        assert_eq!(
            monitor.status().tracked,
            0,
            "{selection}: dead processes stay tracked"
        );
        expect_quiet(&mut monitor, selection, "nothing tracked died").await;
    }
}

/// The kernel drops exit records when the ring buffer is full; the monitor notices the
/// loss counter move, re-checks every tracked process, and still reports each death once.
#[tokio::test]
async fn a_full_ring_buffer_is_noticed_and_reconciled() {
    if !privileged("a_full_ring_buffer_is_noticed_and_reconciled") {
        return;
    }
    // A one-page ring holds 128 records, and the monitor reads it only when asked for the
    // next death, which this test does not do while the 300 processes die.
    let mut monitor = Monitor::start(MonitorConfig {
        selection: "ebpf".parse().unwrap(),
        ebpf: EbpfConfig {
            ring_bytes: 4096,
            ..EbpfConfig::default()
        },
        ..MonitorConfig::default()
    })
    .await
    .expect("eBPF monitor");
    let mut group = OrphanGroup::spawn(300, &["exit", "0"]);
    let expected: HashSet<ProcessKey> = group
        .members
        .iter()
        .map(|&(pid, start_ticks)| ProcessKey { pid, start_ticks })
        .collect();
    for &key in &expected {
        assert_eq!(monitor.track(key), None);
    }
    group.release();
    let all_dead = eventually(ARRIVAL, || {
        expected
            .iter()
            .all(|k| state(k.pid).is_none_or(|s| s == 'Z'))
    });
    assert!(all_dead, "the orphans did not exit");

    let mut by_source = std::collections::HashMap::new();
    for observation in expect_each_once(&mut monitor, "ebpf", &expected).await {
        *by_source.entry(observation.detected_by).or_insert(0) += 1;
    }
    expect_quiet(&mut monitor, "ebpf", "every death was already reported").await;
    let status = monitor.status();
    let ebpf = status
        .sources
        .iter()
        .find(|s| s.name == SourceName::Ebpf)
        .and_then(|s| s.stats.clone());
    assert!(
        ebpf.is_some_and(|stats| stats.lost > 0),
        "the ring never overflowed: {status:?}"
    );
    assert!(status.loss_reconciles >= 1, "{status:?}");
    assert!(
        by_source.get(&DetectedBy::Reconcile).copied().unwrap_or(0) > 0,
        "{by_source:?}"
    );
}
