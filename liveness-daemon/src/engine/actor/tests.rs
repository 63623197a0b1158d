//! The engine over a temporary store, a crafted `/proc` tree, an exit source in memory
//! whose deaths each test decides, and tokio's paused clock: no privileges, and time moves
//! only when a test advances it.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;

use crate::fair::limits::Limits;
use crate::source::ExitObservation;
use crate::source::fake::FakeExits;
use crate::source::monitor::{Monitor, MonitorConfig};
use crate::store::Store;
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, Identity, ProcessKey};
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, ErrorCode, OwnerSpec, PidOwner};
use liveness_common::request;
use liveness_common::session::{DEFAULT_GRACE_MS, EndReason, MAX_GRACE_MS, OnEnd, Phase, Session};
use liveness_common::status::{DaemonInfo, LimitsConfig};
use liveness_proc::fake::FakeProc;

use super::{Context, Engine};
use crate::engine::{
    Acquire, ActionConfig, Ask, Caller, Clock, Command, End, EngineConfig, Op, PRUNE_PERIOD,
    Refusal, Register, Registered, ScopeFailed, Subscribe, Synced,
};

const WALL_MS: i64 = 1_700_000_000_000;
/// How the processes of these tests exit, unless a test says otherwise.
const EXITED: ExitStatus = ExitStatus::Exited { code: 0 };
const UNKNOWN_TIMEOUT: Duration = Duration::from_secs(600);
const PENDING_TTL: Duration = Duration::from_secs(300);
const RETAIN_AGE: Duration = Duration::from_secs(86_400);
/// Bounds a wait for a death, which the source has reported already.
const DEATH_WITHIN: Duration = Duration::from_secs(1);

const ROOT: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};
const ALICE: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 10,
};
const BOB: Caller = Caller {
    uid: 2000,
    gid: 2000,
    pid: 20,
};

struct Fixture {
    proc: FakeProc,
    exits: FakeExits,
    db: tempfile::TempDir,
    engine: Engine,
}

/// An engine whose only exit source is in memory, with its clock on tokio's.
async fn fixture() -> Fixture {
    fixture_with(crate::cgroup::Support::Unusable {
        mount: None,
        controllers: Vec::new(),
        reason: "not in the engine's tests".to_owned(),
    })
    .await
}

/// [`fixture`] with `cgroups` as the host's cgroup support.
async fn fixture_with(cgroups: crate::cgroup::Support) -> Fixture {
    let proc = FakeProc::new();
    for caller in [ROOT, ALICE, BOB] {
        proc.spawn(caller.pid, caller.uid);
    }
    let db = tempfile::tempdir().unwrap();
    let store = Store::open(db.path().join("liveness.db")).unwrap();
    let root = proc.root();
    let (monitor, exits) = Monitor::with_fake(MonitorConfig {
        proc: root.clone(),
        ..MonitorConfig::default()
    });
    let config = EngineConfig {
        unknown_timeout: UNKNOWN_TIMEOUT,
        pending_ttl: PENDING_TTL,
        retain_events: 10_000,
        retain_age: RETAIN_AGE,
        wrappers: Vec::new(),
        subscriber_queue: 64,
        proc: root,
        limits: Limits::new(LimitsConfig::default()),
        clock: Clock::Tokio {
            wall_ms: WALL_MS,
            at: tokio::time::Instant::now(),
        },
        trace_hops: false,
        // Actions are real processes, read in the real /proc.
        actions: ActionConfig {
            proc: Some(liveness_proc::identity::ProcRoot::default()),
            ..ActionConfig::default()
        },
        cgroups: std::sync::Arc::new(cgroups),
        default_cgroup: None,
    };
    let about = DaemonInfo {
        version: "test".into(),
        protocol: 1,
        pid: 1,
        socket: String::new(),
        state_dir: String::new(),
    };
    let engine = Engine::new(store, monitor, config, about).unwrap();
    Fixture {
        proc,
        exits,
        db,
        engine,
    }
}

impl Fixture {
    /// An operation as the engine applies it for a connection (`end` with the survivors
    /// left for the engine to read).
    /// `op` applied as the loop applies it: after SQLite has what was published.
    /// Its refusal as the wire says it.
    fn ask<O: Op>(&mut self, caller: Caller, op: O) -> Result<O::Answer, ErrorBody> {
        Ok(self.apply(caller, op)?)
    }

    fn apply<O: Op>(&mut self, caller: Caller, op: O) -> Result<O::Answer, Refusal> {
        self.engine.caught_up();
        op.apply(&mut Context::new(&mut self.engine), caller)
    }

    /// `op` as a connection sends it, through the engine's checks before any operation.
    fn command<O: Op>(&mut self, caller: Caller, op: O) -> Result<O::Answer, ErrorBody>
    where
        Command: From<Ask<O>>,
    {
        let (reply, mut answer) = oneshot::channel();
        let ask = Ask {
            caller,
            op,
            reply,
            pacing: None,
        };
        Command::from(ask).run(&mut Context::new(&mut self.engine));
        Ok(answer.try_recv().expect("answered at once")?)
    }

    fn register(
        &mut self,
        caller: Caller,
        id: Option<&str>,
        owner: OwnerSpec,
    ) -> Result<Session, ErrorBody> {
        self.ask(caller, registration(id, owner, None, None))
            .map(Session::from)
    }

    /// Registers `id` for `caller` with process `pid` as its owner; it must succeed.
    fn own(&mut self, caller: Caller, id: &str, pid: u32) -> Session {
        let reply = self.register(caller, Some(id), OwnerSpec::Pid(PidOwner { pid }));
        session_of(reply, "register")
    }

    fn get(&mut self, caller: Caller, id: &str, uid: Option<u32>) -> Result<Session, ErrorBody> {
        let session = id.to_owned();
        self.ask(caller, request::Get { session, uid })
    }

    /// The session as root reads it in `uid`'s namespace.
    fn session(&mut self, uid: u32, id: &str) -> Session {
        let reply = self.get(ROOT, id, Some(uid));
        session_of(reply, "get")
    }

    /// The session's row in SQLite, without what waits to be written there.
    fn row(&self, uid: u32, id: &str) -> Session {
        self.engine.ledger.store().get(uid, id).unwrap().unwrap()
    }

    /// Process `pid` (of the crafted tree) exits with `status`.
    fn die(&mut self, pid: u32, status: ExitStatus) {
        self.proc.kill(pid);
        let key = ProcessKey {
            pid,
            start_ticks: 1000 + u64::from(pid),
        };
        assert!(self.exits.die(key, status), "process {pid} is watched");
    }

    /// The next death the source reports, handed to the engine as its loop would.
    async fn next_death(&mut self) {
        let observation = tokio::time::timeout(DEATH_WITHIN, self.engine.watch.wakes().0)
            .await
            .expect("the poller reports the death of a tracked process");
        self.engine.finalize_observed(observation);
    }

    /// A subscriber of every event from now on: the socket the engine writes to.
    fn subscribe(&mut self) -> UnixStream {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        let subscribe = Subscribe {
            socket: ours.into(),
            filter: crate::store::EventFilter::default(),
        };
        let subscription = self.ask(ROOT, subscribe).expect("a subscription");
        subscription.outbox.go_live(subscription.head);
        theirs
    }
}

impl From<Registered> for Session {
    fn from(registered: Registered) -> Session {
        registered.session
    }
}

/// A `register` of `id` (pending without one) owned by `owner`, with a cleanup policy.
fn registration(
    id: Option<&str>,
    owner: OwnerSpec,
    on_end: Option<OnEnd>,
    grace_ms: Option<u64>,
) -> Register {
    let request = request::Register {
        session: id.map(str::to_owned),
        uid: None,
        owner,
        pending: id.is_none(),
        labels: BTreeMap::new(),
        on_end,
        grace_ms,
        until: None,
        wrappers: Vec::new(),
        on_end_run: None,
        on_stall: None,
        cgroup: None,
        no_cgroup: false,
    };
    Register {
        request,
        fds: Vec::new(),
    }
}

fn session_of(answer: Result<impl Into<Session>, ErrorBody>, what: &str) -> Session {
    match answer {
        Ok(session) => session.into(),
        Err(error) => panic!("{what} should succeed with a session, got {error:?}"),
    }
}

/// The wire's code for a refusal.
fn error_of<T: std::fmt::Debug, E: Into<ErrorBody>>(answer: Result<T, E>) -> ErrorCode {
    match answer {
        Err(error) => error.into().code,
        Ok(answer) => panic!("expected an error, got {answer:?}"),
    }
}

/// The events of `kind` about `id` the subscriber received since the last call.
fn published(subscriber: &mut UnixStream, id: &str, kind: &str) -> usize {
    let mut received = String::new();
    // Non-blocking: what the engine wrote so far.
    let _ = subscriber.read_to_string(&mut received);
    received
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
        .filter(|line| line["event"]["session"] == id && line["event"]["kind"] == kind)
        .count()
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
        End {
            request: request::End {
                session: "s".into(),
                uid: Some(ALICE.uid),
                terminate: false,
            },
            survivors: None,
        },
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

    f.die(12, EXITED);
    f.next_death().await;
    let session = f.session(ALICE.uid, "s");
    assert_eq!(
        (session.phase, session.reason, session.detected_by),
        (
            Phase::Ended,
            Some(EndReason::OwnerExited),
            Some(DetectedBy::Ebpf)
        ),
        "the current owner's death ends it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_death_whose_append_failed_is_appended_and_published_once_on_retry() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.own(ALICE, "s", 11);
    let mut batches = f.subscribe();

    f.engine.ledger.parts().0.journal().fail_appends(true);
    f.die(11, EXITED);
    f.next_death().await;
    assert_eq!(
        f.engine.ledger.retry_counts().0,
        1,
        "the death is kept for a retry"
    );
    assert_eq!(f.engine.ledger.counters().failed_commits, 1);
    assert_eq!(
        f.session(ALICE.uid, "s").phase,
        Phase::Active,
        "nothing was committed"
    );
    assert_eq!(
        published(&mut batches, "s", "session.ended"),
        0,
        "nothing unappended is published"
    );

    // What the loop's retry tick does; the first one still fails.
    f.engine.retry_commits();
    assert_eq!(
        f.engine.ledger.retry_counts().0,
        1,
        "still kept after a second failure"
    );
    f.engine.ledger.parts().0.journal().fail_appends(false);
    f.engine.retry_commits();
    assert!(!f.engine.ledger.has_retries(), "appended on the retry");
    f.engine.retry_commits();

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

/// A batch appended and published whose write to SQLite fails: operations are refused
/// meanwhile (they would read the session as still ACTIVE, and `end` would end it twice),
/// and the retry writes it exactly once.
#[tokio::test(start_paused = true)]
async fn published_deaths_that_sqlite_refused_are_written_once_and_read_before_from_memory() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.own(ALICE, "s", 11);
    let mut batches = f.subscribe();

    f.engine.ledger.store().fail_writes(true).unwrap();
    f.die(11, EXITED);
    f.next_death().await;
    assert_eq!(
        published(&mut batches, "s", "session.ended"),
        1,
        "appended to the journal: published"
    );
    assert!(f.engine.ledger.behind(), "kept for SQLite");
    let get = request::Get {
        session: "s".into(),
        uid: None,
    };
    let read = f.ask(ALICE, get).expect("a read is served");
    assert_eq!(
        (read.phase, read.reason),
        (Phase::Ended, Some(EndReason::OwnerExited)),
        "with the ending that waits for SQLite"
    );
    // The barrier that `list`, read off the engine, passes first hands over that ending.
    let waiting = f.command(ALICE, Synced).expect("the barrier answers");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert!(waiting[0].ends(ALICE.uid, "s"));
    let status = f
        .command(ALICE, request::Status {})
        .expect("status is served");
    assert_eq!(status.store.waiting, 1, "{status:?}");
    assert!(!status.store.disk_full, "writes failed for another reason");
    // A request that writes waits for SQLite.
    let touch = request::Touch {
        session: "s".into(),
        ..request::Touch::default()
    };
    assert_eq!(
        error_of(f.command(ALICE, touch)),
        ErrorCode::Internal,
        "not served from a store behind"
    );

    f.engine.ledger.store().fail_writes(false).unwrap();
    f.engine.retry_commits();
    assert!(!f.engine.ledger.behind());
    let session = f.session(ALICE.uid, "s");
    assert_eq!(
        (session.phase, session.reason),
        (Phase::Ended, Some(EndReason::OwnerExited))
    );
    f.engine.retry_commits();
    assert_eq!(
        published(&mut batches, "s", "session.ended"),
        0,
        "published once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reap_outcome_whose_commit_failed_is_committed_and_published_once_on_retry() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let owner = OwnerSpec::Pid(PidOwner { pid: 11 });
    let register = registration(Some("s"), owner, Some(OnEnd::Terminate), Some(1000));
    let registered = f.ask(ALICE, register);
    session_of(registered, "register with on_end terminate");
    let mut batches = f.subscribe();
    f.die(11, EXITED);
    f.next_death().await;
    assert_eq!(published(&mut batches, "s", "session.ended"), 1);

    // The reap (of no process: the tree had no other) finishes while the store fails.
    f.engine.ledger.store().fail_writes(true).unwrap();
    let crate::engine::effects::Done::Reap(done) = f.engine.effects.next().await else {
        panic!("the end started a reap");
    };
    let done = done.expect("the reap's task ran");
    f.engine.record_reaps(vec![done]);
    assert_eq!(
        f.engine.ledger.retry_counts().1,
        1,
        "the outcome is kept for a retry"
    );
    assert_eq!(f.engine.ledger.counters().failed_commits, 1);
    assert_eq!(
        published(&mut batches, "s", "session.reaped"),
        0,
        "nothing uncommitted is published"
    );

    // What the loop's retry tick does; the first one still fails.
    f.engine.retry_commits();
    assert_eq!(
        f.engine.ledger.retry_counts().1,
        1,
        "kept after a second failure"
    );
    f.engine.ledger.store().fail_writes(false).unwrap();
    f.engine.retry_commits();
    assert!(!f.engine.ledger.has_retries(), "committed on the retry");
    f.engine.retry_commits();

    assert_eq!(
        published(&mut batches, "s", "session.reaped"),
        1,
        "the outcome is published exactly once"
    );
    let filter = crate::store::EventFilter {
        session: Some("s".to_owned()),
        creator_uid: Some(ALICE.uid),
    };
    let crate::store::EventPage::Events(stored) = f
        .engine
        .ledger
        .store()
        .events_after(0, 100, &filter)
        .unwrap()
    else {
        panic!("no gap in a new store");
    };
    let reaped = stored
        .iter()
        .filter(|event| event.body.contains("\"session.reaped\""))
        .count();
    assert_eq!(reaped, 1, "stored exactly once: {stored:?}");
    assert!(
        f.engine.ledger.store_mut().reaps_due().unwrap().is_empty(),
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
    let renamed = session_of(
        f.register(ALICE, None, OwnerSpec::Pid(PidOwner { pid: 11 })),
        "another pending register",
    );
    assert_ne!(renamed.id, pending.id, "pending ids are unique");
    let real = rename(&mut f, ALICE, &renamed.id, "real");
    assert!(!real.pending);

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
    tokio::time::advance(PENDING_TTL * 10).await;
    f.engine.housekeeping();
    assert_eq!(
        f.session(ALICE.uid, "real").phase,
        Phase::Active,
        "a renamed session never expires"
    );
    assert_eq!(
        error_of(f.get(ALICE, &renamed.id, None)),
        ErrorCode::NotFound,
        "the pending id is gone after the rename"
    );
}

#[tokio::test(start_paused = true)]
async fn an_owner_on_another_machine_times_out_unless_touched() {
    let mut f = fixture().await;
    // An owner of this boot is watched: it never times out, however idle.
    f.proc.spawn(11, ALICE.uid);
    f.own(ALICE, "local", 11);
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
        request::Touch {
            session: "remote".into(),
            ..request::Touch::default()
        },
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
    assert_eq!(
        f.session(ALICE.uid, "local").phase,
        Phase::Active,
        "an idle local owner timed out"
    );
}

#[tokio::test(start_paused = true)]
async fn a_source_reports_the_exit_status_the_ended_session_keeps() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.own(ALICE, "s", 11);
    let mut batches = f.subscribe();
    let killed = ExitStatus::Signaled {
        signal: 9,
        core_dumped: false,
    };
    f.die(11, killed);
    f.next_death().await;
    let ended = f.session(ALICE.uid, "s");
    assert_eq!(
        (ended.phase, ended.exit, ended.detected_by),
        (Phase::Ended, Some(killed), Some(DetectedBy::Ebpf))
    );
    assert_eq!(published(&mut batches, "s", "session.ended"), 1);
    f.proc.spawn(11, ALICE.uid);
    assert!(
        !f.exits.die(
            ProcessKey {
                pid: 11,
                start_ticks: 1011
            },
            killed
        ),
        "a process that died is watched no more"
    );
}

/// Process `pid` dies of SIGTERM sent, as the kernel's programs saw it, by a member of
/// the tree of the owner `sender_root`.
fn killed_from_the_tree_of(f: &mut Fixture, pid: u32, sender_root: u32) {
    use liveness_common::cause::{Cause, MembersUsage, Sender, Usage};
    use liveness_ebpf::KernelFacts;
    let key = |pid: u32| ProcessKey {
        pid,
        start_ticks: 1000 + u64::from(pid),
    };
    f.proc.kill(pid);
    let facts = KernelFacts {
        cause: Cause::Signal {
            signal: 15,
            sender: Some(Sender {
                pid: 99,
                start_ticks: 1099,
                comm: "kill".into(),
                uid: 2000,
                session: None,
            }),
            kernel: None,
        },
        usage: Usage {
            cpu_user_us: 1,
            cpu_system_us: 2,
            peak_rss_bytes: 4096,
            members: MembersUsage::default(),
        },
        sender_root: Some(key(sender_root)),
        oom_cgroup_id: None,
    };
    let killed = ExitStatus::Signaled {
        signal: 15,
        core_dumped: false,
    };
    assert!(f.exits.die_seen(key(pid), killed, Some(facts)));
}

/// The sender's session is looked up among the ACTIVE sessions in memory, on the death
/// path, and named only in the causes of sessions whose readers may see it.
#[tokio::test(start_paused = true)]
async fn a_senders_session_is_named_only_where_its_readers_may_see_it() {
    use liveness_common::cause::Cause;
    let mut f = fixture().await;
    for (pid, caller) in [(11, ALICE), (12, ALICE), (13, BOB)] {
        f.proc.spawn(pid, caller.uid);
    }
    f.own(ALICE, "target", 11);
    f.own(ROOT, "watched-by-root", 11);
    f.own(ALICE, "other-target", 12);
    f.own(BOB, "bobs-builder", 13);
    let mut batches = f.subscribe();
    let sender_session = |session: &Session| match &session.cause {
        Some(Cause::Signal {
            sender: Some(sender),
            ..
        }) => sender.session.clone(),
        other => panic!("{}: not a signal with a sender: {other:?}", session.id),
    };

    killed_from_the_tree_of(&mut f, 11, 13);
    f.next_death().await;
    let target = f.session(ALICE.uid, "target");
    assert_eq!(
        sender_session(&target),
        None,
        "Bob's session shown to Alice"
    );
    assert!(target.usage.is_some(), "{target:?}");
    let root_s = f.session(ROOT.uid, "watched-by-root");
    assert_eq!(sender_session(&root_s), Some("bobs-builder".into()));
    assert_eq!(published(&mut batches, "target", "session.ended"), 1);

    // The sender's tree is in a session of Alice's too (after Bob's in id order), which root
    // registered for her: Alice reads that one.
    let mut for_alice = registration(
        Some("builder"),
        OwnerSpec::Pid(PidOwner { pid: 13 }),
        None,
        None,
    );
    for_alice.request.uid = Some(ALICE.uid);
    session_of(
        f.ask(ROOT, for_alice).map(Session::from),
        "register for Alice",
    );
    killed_from_the_tree_of(&mut f, 12, 13);
    f.next_death().await;
    let other = f.session(ALICE.uid, "other-target");
    assert_eq!(sender_session(&other), Some("builder".into()));
}

#[tokio::test(start_paused = true)]
async fn an_ended_id_is_refused_until_retention_deletes_the_session() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.own(ALICE, "reused", 11);
    let end = End {
        request: request::End {
            session: "reused".into(),
            uid: None,
            terminate: false,
        },
        survivors: None,
    };
    session_of(f.ask(ALICE, end), "end");
    let again = || {
        registration(
            Some("reused"),
            OwnerSpec::Pid(PidOwner { pid: 11 }),
            None,
            None,
        )
    };
    let refused = f.ask(ALICE, again());
    let message = refused.as_ref().err().map(|e| e.message.clone());
    assert_eq!(error_of(refused), ErrorCode::AlreadyEnded);
    assert!(
        message.is_some_and(|m| m.contains("--retain-age")),
        "says until when"
    );

    tokio::time::advance(RETAIN_AGE - Duration::from_secs(1)).await;
    f.engine.housekeeping();
    assert_eq!(f.session(ALICE.uid, "reused").phase, Phase::Ended, "kept");
    tokio::time::advance(PRUNE_PERIOD).await;
    f.engine.housekeeping();
    assert_eq!(
        error_of(f.get(ALICE, "reused", None)),
        ErrorCode::NotFound,
        "deleted past retention"
    );
    session_of(f.ask(ALICE, again()), "the id is free again");
}

#[tokio::test(start_paused = true)]
async fn the_cleanup_policy_is_set_at_creation_and_bad_values_change_nothing() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let register = |on_end, grace_ms| {
        let owner = OwnerSpec::Pid(PidOwner { pid: 11 });
        registration(Some("s"), owner, on_end, grace_ms)
    };
    let too_long = f.ask(
        ALICE,
        register(Some(OnEnd::Terminate), Some(MAX_GRACE_MS + 1)),
    );
    let message = too_long.as_ref().err().map(|e| e.message.clone());
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
    let message = changed.as_ref().err().map(|e| e.message.clone());
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
/// Sends a `lock_acquire` as a connection would; the answer comes on the receiver, at once
/// or, for one that waits, when it is granted or fails.
fn acquire(
    f: &mut Fixture,
    caller: Caller,
    session: &str,
    name: &str,
    wait: bool,
) -> oneshot::Receiver<Result<Lock, Refusal>> {
    let request = request::LockAcquire {
        name: name.into(),
        session: session.into(),
        uid: None,
        wait,
        timeout_ms: None,
        cluster: false,
    };
    let answer = match f.apply(caller, request) {
        Ok(Acquire::Queued(queued)) => return queued.grant,
        Ok(Acquire::Held(lock)) => Ok(lock),
        Err(refusal) => Err(refusal),
    };
    let (reply, answered) = oneshot::channel();
    let _ = reply.send(answer);
    answered
}

/// The token of a granted lock, which must have been answered already.
fn token_of(answer: &mut oneshot::Receiver<Result<Lock, Refusal>>, what: &str) -> u64 {
    match answer.try_recv() {
        Ok(Ok(lock)) => lock.token,
        other => panic!("{what}: the lock should be granted, got {other:?}"),
    }
}

fn release(f: &mut Fixture, caller: Caller, session: &str, name: &str) -> Result<Lock, ErrorBody> {
    let (name, session) = (name.into(), session.into());
    f.ask(
        caller,
        request::LockRelease {
            name,
            session,
            uid: None,
            cluster: false,
        },
    )
}

/// Renames `caller`'s pending session `from` to `to`.
fn rename(f: &mut Fixture, caller: Caller, from: &str, to: &str) -> Session {
    let request = request::Rename {
        session: from.into(),
        to: to.into(),
        uid: None,
    };
    session_of(f.ask(caller, request), "rename")
}

/// What `lock_list` answers `caller`: the locks from the store, the waiters from the engine.
fn locks(f: &mut Fixture, caller: Caller) -> Vec<Lock> {
    let reader = crate::store::EventReader::open(f.db.path().join("liveness.db")).unwrap();
    let query = crate::store::LockQuery {
        uid: caller.namespace(None).unwrap(),
        after: None,
        limit: usize::MAX,
    };
    let waiting = f.engine.effects.lock_waiters();
    let locks = reader.locks(&query).unwrap().locks;
    locks
        .into_iter()
        .map(|lock| {
            let waiters = waiting.get(&(lock.uid, lock.name.clone())).copied();
            Lock {
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
        release(&mut f, ALICE, "s11", "build").is_ok(),
        "the holder releases"
    );
    let second = token_of(&mut second, "first in line, on release");
    assert!(third.try_recv().is_err(), "still waits");
    // The holder's owner dies: the end releases the lock, the next waiter has it at once.
    f.die(12, EXITED);
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
        End {
            request: request::End {
                session: "quitter".into(),
                uid: None,
                terminate: false,
            },
            survivors: None,
        },
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
        request::LockRelease {
            name: "build".into(),
            session: "s".into(),
            uid: Some(ALICE.uid),
            cluster: false,
        },
    );
    assert_eq!(error_of(named), ErrorCode::Forbidden);
    assert!(
        release(&mut f, BOB, "s", "build").is_ok(),
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
    rename(&mut f, ALICE, &pending.id, "real");
    assert!(release(&mut f, ALICE, "holder", "l").is_ok());
    token_of(&mut waiter, "granted after the rename");
    assert_eq!(locks(&mut f, ALICE)[0].session, "real");
}

#[tokio::test(start_paused = true)]
async fn a_lock_taken_under_a_pending_id_is_released_when_the_renamed_sessions_owner_dies() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    f.proc.spawn(12, ALICE.uid);
    let pending = session_of(
        f.register(ALICE, None, OwnerSpec::Pid(PidOwner { pid: 11 })),
        "pending register",
    );
    let first = token_of(&mut acquire(&mut f, ALICE, &pending.id, "l", false), "free");
    rename(&mut f, ALICE, &pending.id, "real");
    f.own(ALICE, "next", 12);
    let mut waiter = acquire(&mut f, ALICE, "next", "l", true);
    f.die(11, EXITED);
    f.next_death().await;
    let second = token_of(&mut waiter, "the renamed holder's death frees the lock");
    assert!(first < second);
    let listed = locks(&mut f, ALICE);
    assert_eq!((listed.len(), listed[0].session.as_str()), (1, "next"));
}

/// Takes what the runs of end actions say until one finishes, as the loop would.
async fn next_action_done(
    f: &mut Fixture,
) -> (
    crate::store::ActionKey,
    Option<liveness_common::action::ActionOutcome>,
) {
    loop {
        match f.engine.effects.actions().next().await {
            crate::engine::actions::Next::Progress(progress) => f.engine.action_progress(progress),
            crate::engine::actions::Next::Finished(done) => return done.expect("the run's task"),
        }
    }
}

/// Real time: an action is a real process, which a paused clock would time out at once.
#[tokio::test]
async fn an_action_outcome_whose_commit_failed_is_committed_and_published_once_on_retry() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let mut register = registration(Some("s"), OwnerSpec::Pid(PidOwner { pid: 11 }), None, None);
    let action = liveness_common::action::ActionSpec {
        cwd: Some("/".into()),
        ..liveness_common::action::ActionSpec::new(["/bin/true"])
    };
    register.request.on_end_run = Some(vec![action]);
    session_of(f.ask(ALICE, register), "register with an end action");
    let mut batches = f.subscribe();
    f.die(11, EXITED);
    f.next_death().await;
    assert_eq!(published(&mut batches, "s", "session.ended"), 1);

    // The end was published without a wait for the action, which runs meanwhile.
    let (key, outcome) = next_action_done(&mut f).await;
    let outcome = outcome.expect("it ran");
    assert!(outcome.succeeded(), "{outcome:?}");
    f.engine.ledger.store().fail_writes(true).unwrap();
    f.engine.record_actions(vec![(key, outcome)]);
    assert_eq!(f.engine.ledger.retry_counts().2, 1, "kept for a retry");
    assert_eq!(published(&mut batches, "s", "session.action"), 0);
    let status = f.ask(ROOT, liveness_common::request::Status {}).unwrap();
    assert_eq!(
        (status.actions.running, status.actions.uncommitted_outcomes),
        (0, 1),
        "status counts the outcome waiting for its commit, and no run: {:?}",
        status.actions
    );
    f.engine.ledger.store().fail_writes(false).unwrap();
    f.engine.retry_commits();
    f.engine.retry_commits();
    let status = f.ask(ROOT, liveness_common::request::Status {}).unwrap();
    assert_eq!(status.actions.uncommitted_outcomes, 0, "committed");
    let mut lines = String::new();
    // Non-blocking: what the engine wrote so far.
    let _ = batches.read_to_string(&mut lines);
    let count = |kind: &str| lines.lines().filter(|line| line.contains(kind)).count();
    assert_eq!(count("\"session.action\""), 1, "once: {lines}");
    assert_eq!(count("\"session.finalized\""), 1, "{lines}");
    let session = f.session(ALICE.uid, "s");
    assert!(session.is_finalized(), "{session:?}");
    assert!(
        f.engine
            .ledger
            .store()
            .actions_due(None)
            .unwrap()
            .is_empty()
    );
}

/// A death's batch is published before SQLite has it, and waits there while nothing reads
/// it: deaths in a row share one write. Whatever comes next writes them first, so that it
/// reads them and its own events take the seqs after theirs.
#[tokio::test(start_paused = true)]
async fn published_deaths_wait_for_sqlite_together_and_whatever_comes_next_writes_them_first() {
    let mut f = fixture().await;
    for pid in [11, 12, 13] {
        f.proc.spawn(pid, ALICE.uid);
    }
    f.own(ALICE, "a", 11);
    f.own(ALICE, "b", 12);
    let mut batches = f.subscribe();
    f.die(11, EXITED);
    f.next_death().await;
    f.die(12, EXITED);
    f.next_death().await;
    assert_eq!(published(&mut batches, "a", "session.ended"), 1);
    assert!(f.engine.ledger.behind(), "both wait for SQLite");
    let stored = f.row(ALICE.uid, "b");
    assert_eq!(stored.phase, Phase::Active, "not written yet");
    let head = f.engine.ledger.store().head_seq().unwrap();

    f.own(ALICE, "c", 13);
    assert!(!f.engine.ledger.behind(), "written before the registration");
    for id in ["a", "b"] {
        assert_eq!(f.session(ALICE.uid, id).phase, Phase::Ended, "{id}");
    }
    let crate::store::EventPage::Events(stored) = f
        .engine
        .ledger
        .store()
        .events_after(head, 100, &crate::store::EventFilter::default())
        .unwrap()
    else {
        panic!("no gap in a new store");
    };
    let order: Vec<(u64, String)> = stored
        .iter()
        .map(|event| {
            let body: serde_json::Value = serde_json::from_str(&event.body).unwrap();
            (event.seq, format!("{} {}", body["session"], body["kind"]))
        })
        .collect();
    let expected = [
        (head + 1, r#""a" "session.ended""#),
        (head + 2, r#""b" "session.ended""#),
        (head + 3, r#""c" "session.registered""#),
    ]
    .map(|(seq, what)| (seq, what.to_owned()));
    assert_eq!(order, expected, "each seq once, in the order published");
}

/// Deaths a few milliseconds apart share one SQLite write: a published batch that nothing
/// needs in SQLite sooner waits [`crate::engine::APPLY_DELAY`] for it, and a later one joins it.
#[tokio::test(start_paused = true)]
async fn deaths_close_together_share_one_sqlite_write() {
    let mut f = fixture().await;
    for pid in [100, 101] {
        f.proc.spawn(pid, ALICE.uid);
        f.own(ALICE, &format!("s{pid}"), pid);
    }
    f.die(100, EXITED);
    f.next_death().await;
    let at = f.engine.ledger.apply_at().expect("the write is planned");
    assert_eq!(at, tokio::time::Instant::now() + crate::engine::APPLY_DELAY);
    tokio::time::advance(Duration::from_millis(10)).await;
    assert!(
        at > tokio::time::Instant::now(),
        "the write still waits when the second death comes"
    );
    f.die(101, EXITED);
    f.next_death().await;
    assert_eq!(
        f.engine.ledger.apply_at(),
        Some(at),
        "the second joins the first's write"
    );
    assert_eq!(f.engine.ledger.parts().0.waiting(), 2);
    assert!(f.engine.caught_up());
    for id in ["s100", "s101"] {
        let session = f.row(ALICE.uid, id);
        assert_eq!(session.phase, Phase::Ended, "{id}");
    }
}

/// A flood of deaths leaves no more than [`crate::engine::MAX_UNAPPLIED`] published batches
/// waiting for SQLite: the journal and the memory they hold stay bounded.
#[tokio::test(start_paused = true)]
async fn a_flood_of_deaths_is_written_to_sqlite_in_bounded_steps() {
    let mut f = fixture().await;
    let owners = crate::engine::MAX_UNAPPLIED as u32 + 1;
    for pid in 100..100 + owners {
        f.proc.spawn(pid, ALICE.uid);
        f.own(ALICE, &format!("s{pid}"), pid);
    }
    let mut most = 0;
    for pid in 100..100 + owners {
        f.die(pid, EXITED);
        f.next_death().await;
        most = most.max(f.engine.ledger.parts().0.waiting());
    }
    assert_eq!(
        most,
        crate::engine::MAX_UNAPPLIED,
        "bounded, and deaths did wait"
    );
    let first = f.row(ALICE.uid, "s100");
    assert_eq!(
        first.phase,
        Phase::Ended,
        "written once the bound was reached"
    );
}

/// A registration by the same owner that replaces the end actions (no event) is followed in
/// memory: the owner's death ends the session with the new list, as `session.ended` counts it.
#[tokio::test(start_paused = true)]
async fn end_actions_replaced_by_the_same_owner_are_the_ones_its_death_counts() {
    let mut f = fixture().await;
    f.proc.spawn(11, ALICE.uid);
    let owner = || OwnerSpec::Pid(PidOwner { pid: 11 });
    session_of(
        f.ask(ALICE, registration(Some("s"), owner(), None, None)),
        "register",
    );
    let mut again = registration(Some("s"), owner(), None, None);
    again.request.on_end_run = Some(vec![
        liveness_common::action::ActionSpec::new(["/bin/true"]),
        liveness_common::action::ActionSpec::new(["/bin/true"]),
    ]);
    session_of(f.ask(ALICE, again), "register again with end actions");
    let mut batches = f.subscribe();
    f.die(11, EXITED);
    f.next_death().await;
    let mut received = String::new();
    let _ = batches.read_to_string(&mut received);
    let ended: Vec<serde_json::Value> = received
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
        .filter(|line| line["event"]["kind"] == "session.ended")
        .collect();
    assert_eq!(ended.len(), 1, "{received}");
    assert_eq!(ended[0]["event"]["actions"], 2, "{}", ended[0]);
}

/// A cgroup2 mount crafted in `dir` (files, not the kernel's), as the daemon detects it
/// where systemd is not the init.
fn crafted_cgroups(dir: &std::path::Path) -> crate::cgroup::Support {
    let mount = dir.join("cg");
    std::fs::create_dir(&mount).unwrap();
    std::fs::write(mount.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    std::fs::write(mount.join("cgroup.subtree_control"), "").unwrap();
    let mountinfo = dir.join("mountinfo");
    let line = format!(
        "34 33 0:29 / {} rw - cgroup2 cgroup2 rw,nsdelegate\n",
        mount.display()
    );
    std::fs::write(&mountinfo, line).unwrap();
    crate::cgroup::Support::detect(&mountinfo, Err("systemd is not the init".into()))
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_scope_did_not_start_keeps_no_cgroup_and_its_end_reclaims_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture_with(crafted_cgroups(dir.path())).await;
    f.proc.spawn(11, ALICE.uid);
    let mut register = registration(Some("s"), OwnerSpec::Pid(PidOwner { pid: 11 }), None, None);
    register.request.cgroup = Some(Box::new(request::CgroupLimits {
        memory_max: Some(64 << 20),
        ..request::CgroupLimits::default()
    }));
    let registered = session_of(f.ask(ALICE, register), "register");
    let path = std::path::PathBuf::from(&registered.cgroup.expect("a cgroup").path);

    // Another path than the one stored changes nothing.
    let other = ScopeFailed {
        uid: ALICE.uid,
        id: "s".into(),
        path: path.with_file_name("liveness-s1000-1-2.scope"),
    };
    assert_eq!(f.ask(ALICE, other).unwrap(), None);
    assert!(f.session(ALICE.uid, "s").cgroup.is_some());

    let failed = ScopeFailed {
        uid: ALICE.uid,
        id: "s".into(),
        path: path.clone(),
    };
    let cleared = f
        .ask(ALICE, failed)
        .unwrap()
        .expect("the session as written");
    assert_eq!(cleared.cgroup, None);
    assert_eq!(
        f.session(ALICE.uid, "s").cgroup,
        None,
        "get shows no cgroup"
    );
    assert_eq!(f.row(ALICE.uid, "s").cgroup, None, "nor SQLite");
    let in_memory = f.engine.ledger.active_sessions().find(|s| s.id == "s");
    assert_eq!(
        in_memory.expect("ACTIVE").cgroup,
        None,
        "nor the sessions in memory"
    );

    // Its end hands no cgroup to the reclaimer: the one made stays as it was, unread.
    f.die(11, EXITED);
    f.next_death().await;
    let ended = f.session(ALICE.uid, "s");
    assert_eq!((ended.phase, ended.cgroup), (Phase::Ended, None));
    assert!(!f.engine.effects.cgroups().is_reclaiming(&path));
}

/// A session that lasts until its tree does, with a cgroup: its owner's death, which left
/// no member, ends the owner's other session at once, and this one only once the
/// reclaimer's thread says its cgroup holds no process (`cgroup.events`, crafted here),
/// with reason `tree_exited`.
#[tokio::test(start_paused = true)]
async fn a_session_until_tree_with_a_cgroup_ends_once_its_cgroup_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture_with(crafted_cgroups(dir.path())).await;
    f.proc.spawn(11, ALICE.uid);
    let mut register = registration(
        Some("tree"),
        OwnerSpec::Pid(PidOwner { pid: 11 }),
        None,
        None,
    );
    register.request.until = Some(liveness_common::session::Until::Tree);
    register.request.cgroup = Some(Box::default());
    let registered = session_of(f.ask(ALICE, register), "register");
    let path = std::path::PathBuf::from(&registered.cgroup.expect("a cgroup").path);
    let events = path.join("cgroup.events");
    std::fs::write(&events, "populated 1\nfrozen 0\n").unwrap();
    f.own(ALICE, "owner", 11);

    f.die(11, EXITED);
    f.next_death().await;
    assert_eq!(f.session(ALICE.uid, "owner").phase, Phase::Ended);
    let waiting = f.session(ALICE.uid, "tree");
    assert_eq!(waiting.phase, Phase::Active, "its cgroup holds a process");

    std::fs::write(&events, "populated 0\nfrozen 0\n").unwrap();
    // The thread runs on the real clock: its report is polled for, not awaited on tokio's
    // paused one, which would jump past any timeout at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let report = loop {
        let mut next = std::pin::pin!(f.engine.effects.next());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(done) = next.as_mut().poll(&mut cx) {
            break done;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reclaimer did not report"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let crate::engine::effects::Done::Cgroup(report) = report else {
        panic!("a report of the reclaimer's");
    };
    f.engine.cgroup_report(report);
    let ended = f.session(ALICE.uid, "tree");
    assert_eq!(ended.phase, Phase::Ended);
    assert_eq!(ended.reason, Some(EndReason::TreeExited));
}
