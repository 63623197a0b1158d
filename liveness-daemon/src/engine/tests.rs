//! The engine over a temporary store, a crafted `/proc` tree watched by the poller and
//! tokio's paused clock: no privileges, and time moves only when a test advances it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::limits::Limits;
use crate::source::ExitObservation;
use crate::source::monitor::{Monitor, MonitorConfig, Selection};
use crate::store::Store;
use liveness_common::exit::DetectedBy;
use liveness_common::identity::{DeathReason, Identity};
use liveness_common::protocol::{ErrorCode, OwnerSpec, PidOwner, Reply, Request};
use liveness_common::request;
use liveness_common::session::{DEFAULT_GRACE_MS, EndReason, MAX_GRACE_MS, OnEnd, Phase, Session};
use liveness_common::status::{DaemonInfo, LimitsConfig, SourceName};
use liveness_proc::identity::ProcRoot;

use super::{Batch, Caller, Clock, Command, Engine, EngineConfig};

const BOOT_ID: &str = "boot-a";
const WALL_MS: i64 = 1_700_000_000_000;
const POLL: Duration = Duration::from_secs(1);
const UNKNOWN_TIMEOUT: Duration = Duration::from_secs(600);
const PENDING_TTL: Duration = Duration::from_secs(300);
/// Bounds a wait for a death on tokio's paused clock, which jumps ahead when idle.
const DEATH_WITHIN: Duration = Duration::from_secs(3600);

const ROOT: Caller = Caller { uid: 0, pid: 1 };
const ALICE: Caller = Caller { uid: 1000, pid: 10 };
const BOB: Caller = Caller { uid: 2000, pid: 20 };

/// A crafted proc tree: this boot's id and host, and processes with a stat, a status and
/// a PID namespace (all the same one, so pids need no translation).
struct FakeProc {
    dir: tempfile::TempDir,
}

impl FakeProc {
    fn new() -> FakeProc {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sys/kernel/random")).unwrap();
        std::fs::write(
            root.join("sys/kernel/random/boot_id"),
            format!("{BOOT_ID}\n"),
        )
        .unwrap();
        std::fs::write(root.join("sys/kernel/hostname"), "devbox\n").unwrap();
        std::fs::create_dir_all(root.join("self/ns")).unwrap();
        std::fs::write(root.join("self/ns/pid"), "").unwrap();
        let proc = FakeProc { dir };
        for caller in [ROOT, ALICE, BOB] {
            proc.spawn(caller.pid, caller.uid);
        }
        proc
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Process `pid` of user `uid`, a child of init, started at tick `1000 + pid`.
    fn spawn(&self, pid: u32, uid: u32) {
        let dir = self.root().join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        // Fields 3..=22 as proc(5) numbers them: state, ppid, ..., num_threads, starttime.
        let mut fields = vec!["0".to_owned(); 20];
        fields[0] = "S".into();
        fields[1] = "1".into();
        fields[17] = "1".into();
        fields[19] = (1000 + u64::from(pid)).to_string();
        let stat = format!("{pid} (proc{pid}) {} 0 0 0\n", fields.join(" "));
        std::fs::write(dir.join("stat"), stat).unwrap();
        let status = format!("Name:\tproc{pid}\nTgid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
        std::fs::write(dir.join("status"), status).unwrap();
        std::os::unix::fs::symlink(self.root().join("self/ns/pid"), dir.join("ns/pid")).unwrap();
    }

    fn kill(&self, pid: u32) {
        std::fs::remove_dir_all(self.root().join(pid.to_string())).unwrap();
    }
}

struct Fixture {
    proc: FakeProc,
    db: tempfile::TempDir,
    engine: Engine,
}

/// An engine whose only exit source polls the crafted tree, with its clock on tokio's.
async fn fixture() -> Fixture {
    let proc = FakeProc::new();
    let db = tempfile::tempdir().unwrap();
    let store = Store::open(db.path().join("liveness.db")).unwrap();
    let root = ProcRoot::new(proc.root());
    let monitor = Monitor::start(MonitorConfig {
        selection: Selection::Only(vec![SourceName::Procpoll]),
        procpoll_interval: POLL,
        proc: root.clone(),
        ..MonitorConfig::default()
    })
    .await
    .unwrap();
    let config = EngineConfig {
        unknown_timeout: UNKNOWN_TIMEOUT,
        pending_ttl: PENDING_TTL,
        retain_events: 10_000,
        retain_age: Duration::from_secs(86_400),
        wrappers: Vec::new(),
        subscriber_queue: 64,
        proc: root,
        limits: Limits::new(LimitsConfig::default()),
        clock: Clock::Tokio {
            wall_ms: WALL_MS,
            at: tokio::time::Instant::now(),
        },
        trace_hops: false,
    };
    let about = DaemonInfo {
        version: "test".into(),
        protocol: 1,
        pid: 1,
        socket: String::new(),
        state_dir: String::new(),
    };
    let engine = Engine::new(store, monitor, config, about).unwrap();
    Fixture { proc, db, engine }
}

impl Fixture {
    /// A request as a connection hands it to the engine (`end` with the survivors left
    /// for the engine to read).
    fn ask(&mut self, caller: Caller, request: Request) -> Reply {
        match request {
            Request::End(request::End {
                session,
                uid,
                terminate,
            }) => self.engine.end(caller, &session, uid, terminate, None),
            request => self.engine.request(caller, request, &[]),
        }
    }

    fn register(&mut self, caller: Caller, id: Option<&str>, owner: OwnerSpec) -> Reply {
        self.ask(
            caller,
            Request::Register(request::Register {
                session: id.map(str::to_owned),
                uid: None,
                owner,
                pending: id.is_none(),
                labels: BTreeMap::new(),
                on_end: None,
                grace_ms: None,
                wrappers: Vec::new(),
            }),
        )
    }

    /// Registers `id` for `caller` with process `pid` as its owner; it must succeed.
    fn own(&mut self, caller: Caller, id: &str, pid: u32) -> Session {
        let reply = self.register(caller, Some(id), OwnerSpec::Pid(PidOwner { pid }));
        session_of(reply, "register")
    }

    fn get(&mut self, caller: Caller, id: &str, uid: Option<u32>) -> Reply {
        let session = id.to_owned();
        self.ask(caller, Request::Get(request::Get { session, uid }))
    }

    /// The session as root reads it in `uid`'s namespace.
    fn session(&mut self, uid: u32, id: &str) -> Session {
        let reply = self.get(ROOT, id, Some(uid));
        session_of(reply, "get")
    }

    /// The next death the poller reports, handed to the engine as its loop would.
    async fn next_death(&mut self) {
        let observation = tokio::time::timeout(DEATH_WITHIN, self.engine.monitor.next())
            .await
            .expect("the poller reports the death of a tracked process");
        self.engine.finalize_observed(observation);
    }

    fn subscribe(&mut self) -> mpsc::Receiver<Batch> {
        let (reply, mut subscription) = oneshot::channel();
        self.engine.handle(Command::Subscribe { reply });
        let subscription = subscription
            .try_recv()
            .expect("the engine answers a subscription at once");
        subscription.batches
    }
}

fn session_of(reply: Reply, what: &str) -> Session {
    match reply {
        Reply {
            ok: true,
            session: Some(session),
            ..
        } => session,
        other => panic!("{what} should succeed with a session, got {other:?}"),
    }
}

fn error_of(reply: Reply) -> ErrorCode {
    match reply.error {
        Some(error) if !reply.ok => error.code,
        _ => panic!("expected an error, got {reply:?}"),
    }
}

/// The events of `kind` about `id` in the batches received since the last call.
fn published(batches: &mut mpsc::Receiver<Batch>, id: &str, kind: &str) -> usize {
    let kind = format!("\"{kind}\"");
    let mut count = 0;
    while let Ok(batch) = batches.try_recv() {
        count += batch
            .iter()
            .filter(|published| published.session == id && published.line.contains(&kind))
            .count();
    }
    count
}

#[tokio::test(start_paused = true)]
async fn users_see_only_their_own_sessions_and_root_names_any_users() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.proc.spawn(21, BOB.uid);
    f.own(ALICE, "s", 11);

    let hidden = f.get(BOB, "s", None);
    assert_eq!(
        error_of(hidden),
        ErrorCode::NotFound,
        "another user's session is not in bob's namespace"
    );
    let named = f.get(BOB, "s", Some(ALICE.uid));
    assert_eq!(
        error_of(named),
        ErrorCode::Forbidden,
        "only root names another user's namespace"
    );
    let ended = f.ask(
        BOB,
        Request::End(request::End {
            session: "s".into(),
            uid: Some(ALICE.uid),
            terminate: false,
        }),
    );
    assert_eq!(
        error_of(ended),
        ErrorCode::Forbidden,
        "bob cannot end alice's"
    );
    let borrowed = f.register(BOB, Some("b"), OwnerSpec::Pid(PidOwner { pid: 11 }));
    assert_eq!(
        error_of(borrowed),
        ErrorCode::Forbidden,
        "bob cannot own a session by alice's process"
    );

    // The same id in bob's namespace is another session.
    f.own(BOB, "s", 21);
    let ambiguous = f.get(ROOT, "s", None);
    assert_eq!(
        error_of(ambiguous),
        ErrorCode::Ambiguous,
        "root must say whose"
    );
    let alices = f.session(ALICE.uid, "s");
    assert_eq!((alices.creator_uid, alices.owner.pid), (ALICE.uid, 11));
    let bobs = session_of(f.get(BOB, "s", None), "bob's own get");
    assert_eq!((bobs.creator_uid, bobs.owner.pid), (BOB.uid, 21));
    assert_eq!(
        f.session(ALICE.uid, "s").phase,
        Phase::Active,
        "nothing bob did changed alice's session"
    );
}

#[tokio::test(start_paused = true)]
async fn an_earlier_owners_death_does_not_end_a_session_with_a_new_owner() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.proc.spawn(12, ALICE.uid);
    let first = f.own(ALICE, "s", 11).owner;
    let second = f.own(ALICE, "s", 12).owner;
    assert_ne!(first, second, "the second registration is a new turn");

    // The first owner dies, and a source reports it after the new turn began.
    f.proc.kill(11);
    f.engine.finalize_observed(ExitObservation {
        key: first.key(),
        reason: DeathReason::Exited,
        status: None,
        detected_by: DetectedBy::Procpoll,
        at: SystemTime::now(),
        died_at: None,
        facts: None,
    });
    let session = f.session(ALICE.uid, "s");
    assert_eq!(
        (session.phase, session.owner),
        (Phase::Active, second),
        "the session now belongs to its second owner"
    );

    f.proc.kill(12);
    f.next_death().await;
    let session = f.session(ALICE.uid, "s");
    assert_eq!(
        (session.phase, session.reason, session.detected_by),
        (
            Phase::Ended,
            Some(EndReason::OwnerExited),
            Some(DetectedBy::Procpoll)
        ),
        "the current owner's death ends it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_death_whose_commit_failed_is_committed_and_published_once_on_retry() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.own(ALICE, "s", 11);
    let mut batches = f.subscribe();

    f.engine.store.fail_writes(true).unwrap();
    f.proc.kill(11);
    f.next_death().await;
    assert_eq!(
        f.engine.uncommitted.deaths.len(),
        1,
        "the death is kept for a retry"
    );
    assert_eq!(f.engine.counters.failed_commits, 1);
    assert_eq!(
        f.session(ALICE.uid, "s").phase,
        Phase::Active,
        "nothing was committed"
    );
    assert_eq!(
        published(&mut batches, "s", "session.ended"),
        0,
        "nothing uncommitted is published"
    );

    // What the loop's retry tick does; the first one still fails.
    f.engine.finalize(Vec::new());
    assert_eq!(
        f.engine.uncommitted.deaths.len(),
        1,
        "still kept after a second failure"
    );
    f.engine.store.fail_writes(false).unwrap();
    f.engine.finalize(Vec::new());
    assert!(f.engine.uncommitted.is_empty(), "committed on the retry");
    f.engine.finalize(Vec::new());

    let session = f.session(ALICE.uid, "s");
    assert_eq!(
        (session.phase, session.reason),
        (Phase::Ended, Some(EndReason::OwnerExited))
    );
    assert_eq!(
        published(&mut batches, "s", "session.ended"),
        1,
        "the end is published exactly once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reap_outcome_whose_commit_failed_is_committed_and_published_once_on_retry() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let registered = f.ask(
        ALICE,
        Request::Register(request::Register {
            session: Some("s".into()),
            uid: None,
            owner: OwnerSpec::Pid(PidOwner { pid: 11 }),
            pending: false,
            labels: BTreeMap::new(),
            on_end: Some(OnEnd::Terminate),
            grace_ms: Some(1000),
            wrappers: Vec::new(),
        }),
    );
    session_of(registered, "register with on_end terminate");
    let mut batches = f.subscribe();
    f.proc.kill(11);
    f.next_death().await;
    assert_eq!(published(&mut batches, "s", "session.ended"), 1);

    // The reap (of no process: the tree had no other) finishes while the store fails.
    f.engine.store.fail_writes(true).unwrap();
    let done = f
        .engine
        .reaps
        .join_next()
        .await
        .expect("the end started a reap");
    f.engine.finish_reap(done);
    assert_eq!(
        f.engine.uncommitted.reaps.len(),
        1,
        "the outcome is kept for a retry"
    );
    assert_eq!(f.engine.counters.failed_commits, 1);
    assert_eq!(
        published(&mut batches, "s", "session.reaped"),
        0,
        "nothing uncommitted is published"
    );

    // What the loop's retry tick does; the first one still fails.
    f.engine.retry_commits();
    assert_eq!(
        f.engine.uncommitted.reaps.len(),
        1,
        "kept after a second failure"
    );
    f.engine.store.fail_writes(false).unwrap();
    f.engine.retry_commits();
    assert!(f.engine.uncommitted.is_empty(), "committed on the retry");
    f.engine.retry_commits();

    assert_eq!(
        published(&mut batches, "s", "session.reaped"),
        1,
        "the outcome is published exactly once"
    );
    let filter = crate::store::EventFilter {
        session: Some("s"),
        creator_uid: Some(ALICE.uid),
    };
    let crate::store::EventPage::Events(stored) =
        f.engine.store.events_after(0, 100, &filter).unwrap()
    else {
        panic!("no gap in a new store");
    };
    let reaped = stored
        .iter()
        .filter(|event| event.body.contains("\"session.reaped\""))
        .count();
    assert_eq!(reaped, 1, "stored exactly once: {stored:?}");
    assert!(
        f.engine.store.reaps_due().unwrap().is_empty(),
        "no longer due"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pending_session_never_renamed_expires_after_its_ttl() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let pending = session_of(
        f.register(ALICE, None, OwnerSpec::Pid(PidOwner { pid: 11 })),
        "pending register",
    );
    assert!(pending.pending, "registered as pending");

    tokio::time::advance(PENDING_TTL - Duration::from_secs(1)).await;
    f.engine.housekeeping();
    assert_eq!(
        f.session(ALICE.uid, &pending.id).phase,
        Phase::Active,
        "not expired before its ttl"
    );

    tokio::time::advance(Duration::from_secs(2)).await;
    f.engine.housekeeping();
    let expired = f.session(ALICE.uid, &pending.id);
    assert_eq!(
        (expired.phase, expired.reason),
        (Phase::Ended, Some(EndReason::PendingExpired))
    );
}

#[tokio::test(start_paused = true)]
async fn an_owner_on_another_machine_times_out_unless_touched() {
    let mut f = fixture().await;
    let remote = Identity {
        pid: 4242,
        start_ticks: 7,
        boot_id: "boot-of-another-machine".into(),
        host: "elsewhere".into(),
        pidfs_ino: None,
        comm: "agent".into(),
    };
    let session = session_of(
        f.register(ALICE, Some("remote"), OwnerSpec::Identity(remote)),
        "register a remote owner",
    );
    assert_eq!(session.phase, Phase::Active);

    tokio::time::advance(UNKNOWN_TIMEOUT - Duration::from_secs(1)).await;
    f.engine.housekeeping();
    assert_eq!(f.session(ALICE.uid, "remote").phase, Phase::Active);
    let touched = f.ask(
        ALICE,
        Request::Touch(request::Touch {
            session: "remote".into(),
            uid: None,
        }),
    );
    session_of(touched, "touch");

    tokio::time::advance(Duration::from_secs(2)).await;
    f.engine.housekeeping();
    assert_eq!(
        f.session(ALICE.uid, "remote").phase,
        Phase::Active,
        "a touch postpones the timeout"
    );

    tokio::time::advance(UNKNOWN_TIMEOUT).await;
    f.engine.housekeeping();
    let idle = f.session(ALICE.uid, "remote");
    assert_eq!(
        (idle.phase, idle.reason),
        (Phase::Ended, Some(EndReason::Timeout)),
        "idle for the whole timeout since the touch"
    );
}

#[tokio::test(start_paused = true)]
async fn the_cleanup_policy_is_set_at_creation_and_bad_values_change_nothing() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let register = |on_end, grace_ms| {
        Request::Register(request::Register {
            session: Some("s".into()),
            uid: None,
            owner: OwnerSpec::Pid(PidOwner { pid: 11 }),
            pending: false,
            labels: BTreeMap::new(),
            on_end,
            grace_ms,
            wrappers: Vec::new(),
        })
    };
    let too_long = f.ask(
        ALICE,
        register(Some(OnEnd::Terminate), Some(MAX_GRACE_MS + 1)),
    );
    let message = too_long.error.as_ref().map(|e| e.message.clone());
    assert_eq!(error_of(too_long), ErrorCode::InvalidRequest);
    assert!(
        message.as_deref().is_some_and(|m| m.contains("grace_ms")),
        "{message:?}"
    );
    assert_eq!(
        error_of(f.get(ALICE, "s", None)),
        ErrorCode::NotFound,
        "a refused registration stores nothing"
    );

    let created = session_of(
        f.ask(ALICE, register(Some(OnEnd::Terminate), Some(1500))),
        "register with a policy",
    );
    assert_eq!((created.on_end, created.grace_ms), (OnEnd::Terminate, 1500));
    session_of(
        f.ask(ALICE, register(None, None)),
        "a later turn that names no policy keeps it",
    );
    session_of(
        f.ask(ALICE, register(Some(OnEnd::Terminate), Some(1500))),
        "a later turn may repeat it",
    );
    let changed = f.ask(ALICE, register(Some(OnEnd::Leave), None));
    let message = changed.error.as_ref().map(|e| e.message.clone());
    assert_eq!(error_of(changed), ErrorCode::InvalidRequest);
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("set when a session is created")),
        "{message:?}"
    );
    let kept = f.session(ALICE.uid, "s");
    assert_eq!((kept.on_end, kept.grace_ms), (OnEnd::Terminate, 1500));

    f.proc.spawn(12, ALICE.uid);
    let plain = f.own(ALICE, "plain", 12);
    assert_eq!(
        (plain.on_end, plain.grace_ms),
        (OnEnd::Leave, DEFAULT_GRACE_MS)
    );
}
/// Sends a `lock_acquire` as a connection would; the reply comes on the receiver, at once
/// or, for one that waits, when it is granted or fails.
fn acquire(
    f: &mut Fixture,
    caller: Caller,
    session: &str,
    name: &str,
    wait: bool,
) -> oneshot::Receiver<Reply> {
    let (reply, answer) = oneshot::channel();
    let request = Request::LockAcquire(request::LockAcquire {
        name: name.into(),
        session: session.into(),
        uid: None,
        wait,
        timeout_ms: None,
    });
    f.engine.handle(Command::Request {
        caller,
        request: Box::new(request),
        fds: Vec::new(),
        reply,
    });
    answer
}

/// The token of a granted lock, which must have been answered already.
fn token_of(answer: &mut oneshot::Receiver<Reply>, what: &str) -> u64 {
    match answer.try_recv() {
        Ok(Reply {
            ok: true,
            lock: Some(lock),
            ..
        }) => lock.token,
        other => panic!("{what}: the lock should be granted, got {other:?}"),
    }
}

fn release(f: &mut Fixture, caller: Caller, session: &str, name: &str) -> Reply {
    let (name, session) = (name.into(), session.into());
    f.ask(
        caller,
        Request::LockRelease(request::LockRelease {
            name,
            session,
            uid: None,
        }),
    )
}

/// What `lock_list` answers `caller`: the locks from the store, the waiters from the engine.
fn locks(f: &mut Fixture, caller: Caller) -> Vec<liveness_common::lock::Lock> {
    let reader = crate::store::EventReader::open(f.db.path().join("liveness.db")).unwrap();
    let query = crate::store::LockQuery {
        uid: caller.namespace(None).unwrap(),
        after: None,
        limit: usize::MAX,
    };
    let waiting = f.engine.waiting();
    let locks = reader.locks(&query).unwrap().locks;
    locks
        .into_iter()
        .map(|lock| {
            let waiters = waiting.get(&(lock.uid, lock.name.clone())).copied();
            liveness_common::lock::Lock {
                waiters: waiters.unwrap_or(0),
                ..lock
            }
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn waiters_get_a_lock_in_order_as_it_is_released_or_its_holder_dies() {
    let mut f = fixture().await;
    for pid in [11, 12, 13, 14] {
        f.proc.spawn(pid, ALICE.uid);
        f.own(ALICE, &format!("s{pid}"), pid);
    }
    let first = token_of(&mut acquire(&mut f, ALICE, "s11", "build", false), "free");
    let mut busy = acquire(&mut f, ALICE, "s12", "build", false);
    assert_eq!(
        error_of(busy.try_recv().unwrap()),
        ErrorCode::LockHeld,
        "held, and the request does not wait"
    );
    let mut second = acquire(&mut f, ALICE, "s12", "build", true);
    let gone = acquire(&mut f, ALICE, "s13", "build", true);
    let mut third = acquire(&mut f, ALICE, "s14", "build", true);
    assert!(second.try_recv().is_err(), "waits while held");
    assert_eq!(locks(&mut f, ALICE)[0].waiters, 3);
    drop(gone);
    assert_eq!(
        locks(&mut f, ALICE)[0].waiters,
        2,
        "a waiter whose connection closed is not counted"
    );

    assert!(
        release(&mut f, ALICE, "s11", "build").ok,
        "the holder releases"
    );
    let second = token_of(&mut second, "first in line, on release");
    assert!(third.try_recv().is_err(), "still waits");
    // The holder's owner dies: the end releases the lock, the next waiter has it at once.
    f.proc.kill(12);
    f.next_death().await;
    let third = token_of(
        &mut third,
        "next in line, skipping the closed one, on death",
    );
    assert!(first < second && second < third, "{first} {second} {third}");
    let listed = locks(&mut f, ALICE);
    assert_eq!(
        (listed.len(), listed[0].session.as_str(), listed[0].waiters),
        (1, "s14", 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_pending_sessions_lock_is_freed_when_it_expires_and_its_waiters_leave_when_they_end() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.proc.spawn(12, ALICE.uid);
    f.proc.spawn(13, ALICE.uid);
    let stuck = session_of(
        f.register(ALICE, None, OwnerSpec::Pid(PidOwner { pid: 11 })),
        "pending register",
    );
    token_of(
        &mut acquire(&mut f, ALICE, &stuck.id, "worktree", false),
        "pending holder",
    );
    f.own(ALICE, "waiter", 12);
    f.own(ALICE, "quitter", 13);
    let mut quitter = acquire(&mut f, ALICE, "quitter", "worktree", true);
    let mut waiter = acquire(&mut f, ALICE, "waiter", "worktree", true);
    let ended = f.ask(
        ALICE,
        Request::End(request::End {
            session: "quitter".into(),
            uid: None,
            terminate: false,
        }),
    );
    session_of(ended, "end");
    assert_eq!(
        error_of(quitter.try_recv().expect("answered when its session ends")),
        ErrorCode::AlreadyEnded,
        "a waiter whose session ended leaves the queue"
    );

    // The pending session is never renamed and its owner lives on: only expiry ends it.
    tokio::time::advance(PENDING_TTL + Duration::from_secs(1)).await;
    f.engine.housekeeping();
    assert_eq!(
        f.session(ALICE.uid, &stuck.id).reason,
        Some(EndReason::PendingExpired)
    );
    token_of(&mut waiter, "the expired session's lock goes to the waiter");
}

#[tokio::test(start_paused = true)]
async fn lock_names_are_per_user_and_no_user_releases_anothers() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.proc.spawn(21, BOB.uid);
    f.own(ALICE, "s", 11);
    f.own(BOB, "s", 21);
    token_of(&mut acquire(&mut f, ALICE, "s", "build", false), "alice's");
    token_of(
        &mut acquire(&mut f, BOB, "s", "build", false),
        "bob's own build lock",
    );
    assert_eq!(locks(&mut f, BOB).len(), 1, "bob sees only his own");
    assert_eq!(locks(&mut f, ROOT).len(), 2, "root sees every user's");

    let named = f.ask(
        BOB,
        Request::LockRelease(request::LockRelease {
            name: "build".into(),
            session: "s".into(),
            uid: Some(ALICE.uid),
        }),
    );
    assert_eq!(error_of(named), ErrorCode::Forbidden);
    assert!(
        release(&mut f, BOB, "s", "build").ok,
        "bob releases his own"
    );
    assert_eq!(
        error_of(release(&mut f, BOB, "s", "build")),
        ErrorCode::NotHeld,
        "released once"
    );
    let alices = locks(&mut f, ALICE);
    assert_eq!(
        (alices.len(), alices[0].uid, alices[0].session.as_str()),
        (1, ALICE.uid, "s"),
        "alice's lock is untouched"
    );
    let mut bad = acquire(&mut f, ALICE, "s", "", false);
    assert_eq!(error_of(bad.try_recv().unwrap()), ErrorCode::InvalidRequest);
}

#[tokio::test(start_paused = true)]
async fn a_pending_waiter_renamed_while_it_waits_gets_the_lock_under_its_real_id() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.proc.spawn(12, ALICE.uid);
    f.own(ALICE, "holder", 11);
    let pending = session_of(
        f.register(ALICE, None, OwnerSpec::Pid(PidOwner { pid: 12 })),
        "pending register",
    );
    token_of(&mut acquire(&mut f, ALICE, "holder", "l", false), "holder");
    let mut waiter = acquire(&mut f, ALICE, &pending.id, "l", true);
    let renamed = f.ask(
        ALICE,
        Request::Rename(request::Rename {
            session: pending.id.clone(),
            to: "real".into(),
            uid: None,
        }),
    );
    session_of(renamed, "rename");
    assert!(release(&mut f, ALICE, "holder", "l").ok);
    token_of(&mut waiter, "granted after the rename");
    assert_eq!(locks(&mut f, ALICE)[0].session, "real");
}
