//! No user can stall another's deaths: while another uid attacks the daemon with work
//! whose size or timing it chooses, a victim's death → event latency stays within twice
//! its baseline, measured in the same run, and root's `status` answers within 100 ms.

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use integration_tests::{
    ClientAs, Conn, Daemon, Fingerprint, Orphan, TestprocAs, eventually, open_socket_to_everyone,
    privileged,
};
use serde_json::{Value, json};

/// The attacker.
const MALLORY: u32 = 61_030;
/// Deaths timed per measurement.
const DEATHS: usize = 25;
/// How long root's `status` may take while another user attacks.
const STATUS_BOUND: Duration = Duration::from_millis(100);
/// What an attack may add to a victim's median death latency: twice the baseline, or the
/// baseline and 2 ms where that is more. A death held up by a client's work waits for that
/// work (tens of milliseconds and up); sub-millisecond medians double from scheduling
/// noise alone on a loaded two-core machine.
fn latency_bound(baseline: Duration) -> Duration {
    (baseline * 2).max(baseline + Duration::from_millis(2))
}

/// Root, whose sessions' deaths are timed. Each death has a subscription of its own, to
/// its session: what the attacker's sessions publish is not read here.
struct Victim {
    socket: std::path::PathBuf,
    control: Conn,
    round: usize,
}

impl Victim {
    fn new(daemon: &Daemon) -> Victim {
        Victim {
            socket: daemon.socket.clone(),
            control: daemon.connect(),
            round: 0,
        }
    }

    /// The median time from a SIGKILL of an owner to its `session.ended`.
    fn death_latency(&mut self) -> Duration {
        let mut times: Vec<Duration> = (0..DEATHS).map(|_| self.one_death()).collect();
        times.sort();
        times[times.len() / 2]
    }

    fn one_death(&mut self) -> Duration {
        self.round += 1;
        let session = format!("victim-{}", self.round);
        let mut stream = Conn::connect(&self.socket);
        let subscribed = stream.request(json!({"op": "subscribe", "session": session}));
        assert_eq!(subscribed["ok"], true, "{subscribed}");
        let owner = Orphan::spawn(&["exit", "0"]);
        let reply = self
            .control
            .request(json!({"op": "register", "session": session, "owner": {"pid": owner.pid}}));
        assert_eq!(reply["ok"], true, "{reply}");
        let registered = stream.next_line().expect("the stream is open");
        assert_eq!(
            registered["event"]["kind"], "session.registered",
            "{registered}"
        );
        let killed = Instant::now();
        // SAFETY: killing the orphan this test started.
        unsafe { libc::kill(owner.pid as i32, libc::SIGKILL) };
        let ended = stream
            .next_within(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("no end of {session} within 30 s"));
        let latency = killed.elapsed();
        assert_eq!(ended["event"]["kind"], "session.ended", "{ended}");
        latency
    }

    /// The slowest of a few `status` requests.
    fn status_time(&mut self) -> Duration {
        (0..5)
            .map(|_| {
                let asked = Instant::now();
                assert_eq!(self.control.request(json!({"op": "status"}))["ok"], true);
                asked.elapsed()
            })
            .max()
            .unwrap_or_default()
    }
}

/// Held by each test for its whole run: one test's attack must not be measured as noise in
/// another's baseline, nor its processes slow another's.
fn alone() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Measures the victim's baseline, starts `attack`, and checks the victim while it runs.
fn holds_while(daemon: &Daemon, what: &str, attack: impl FnOnce() -> Attack) {
    let mut victim = Victim::new(daemon);
    let baseline = victim.death_latency();
    let attack = attack();
    // The attack is under way before anything is measured.
    std::thread::sleep(Duration::from_millis(300));
    let attacked = victim.death_latency();
    let status = victim.status_time();
    let rounds = attack.stop();
    eprintln!(
        "{what}: death → event median {baseline:?} alone, {attacked:?} attacked \
         ({rounds} attack rounds); root's status {status:?}"
    );
    assert!(rounds > 0, "{what}: the attack never ran");
    assert!(
        attacked <= latency_bound(baseline),
        "{what}: a victim's death took {attacked:?} at the median under attack, against \
         {baseline:?} alone"
    );
    assert!(
        status <= STATUS_BOUND,
        "{what}: root's status took {status:?} under attack"
    );
}

/// Threads of the attacker looping a request, each on a connection of its own.
///
/// The attacker's own processes run at the lowest priority, and its replies are checked
/// without being parsed: the CPU an attacker burns in its own processes is for the
/// kernel's scheduler to share out, and what is measured here is what it makes the
/// daemon do.
struct Attack {
    stop: Arc<AtomicBool>,
    loops: Vec<std::thread::JoinHandle<usize>>,
}

impl Attack {
    fn looping(daemon: &Daemon, connections: usize, request: Value) -> Attack {
        Attack::rounds(daemon, connections, move |client| {
            assert_ok(&client.raw_request(&request));
        })
    }

    /// `connections` threads, each running `round` on a connection of its own until
    /// stopped.
    fn rounds(
        daemon: &Daemon,
        connections: usize,
        round: impl Fn(&mut Attacker) + Clone + Send + 'static,
    ) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let loops = (0..connections)
            .map(|_| {
                let socket = daemon.socket.to_string_lossy();
                let mut client = Attacker {
                    process: TestprocAs::spawn_niced(MALLORY, 19, &["client", &socket]),
                    round: 0,
                };
                let (stop, round) = (Arc::clone(&stop), round.clone());
                std::thread::spawn(move || {
                    // The attacker's side of the test process, too, at the lowest priority.
                    // SAFETY: setpriority of the calling thread (Linux: `who` 0).
                    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
                    while !stop.load(Ordering::Relaxed) {
                        round(&mut client);
                        client.round += 1;
                    }
                    client.round
                })
            })
            .collect();
        Attack { stop, loops }
    }

    fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.loops
            .into_iter()
            .map(|handle| handle.join().expect("an attack loop failed"))
            .sum()
    }
}

/// One connection of the attacker's.
struct Attacker {
    process: TestprocAs,
    /// How many rounds it made.
    round: usize,
}

impl Attacker {
    /// Sends `request` and returns the reply line, unparsed.
    fn raw_request(&mut self, request: &Value) -> String {
        let to = self.process.to.as_mut().expect("stdin");
        writeln!(to, "{request}").expect("send a request");
        self.process.read_line().expect("a reply")
    }
}

/// Fails unless a reply line says `ok`, reading only its start (`ok` is its first field).
fn assert_ok(reply: &str) {
    assert!(
        reply.starts_with(r#"{"ok":true"#),
        "{}",
        &reply[..reply.len().min(300)]
    );
}

/// A process of the attacker's with `count` children, alive until dropped.
fn tree_of_mallory(count: usize) -> TestprocAs {
    let mut tree = TestprocAs::spawn(MALLORY, &["tree", &count.to_string()]);
    assert_eq!(tree.read_line().as_deref(), Some("ready\n"));
    tree
}

/// Item 1 of the hardening issue: one `sendmsg` carrying a socket whose close blocks (a
/// lingering TCP socket with unsent data) froze the daemon for every user, since the
/// descriptor was closed where deaths wait. It is refused at receipt as not a pidfd, and
/// closed where only its sender waits.
#[test]
fn a_passed_descriptor_whose_close_blocks_stalls_nobody() {
    if !privileged("a_passed_descriptor_whose_close_blocks_stalls_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let lingering = |line: &str| {
        let socket = daemon.socket.to_string_lossy();
        let mut attacker = TestprocAs::spawn(MALLORY, &["linger", &socket, line]);
        let reply = attacker.read_line().expect("the daemon's reply");
        let reply: Value =
            serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply:?}: {e}"));
        (attacker, reply)
    };
    let (_registering, refused) =
        lingering(r#"{"op":"register","session":"x","owner":{"pidfd":0}}"#);
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_owner", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("is a socket, not a pidfd"), "{refused}");
    let (_asking, status) = lingering(r#"{"op":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");

    let mut victim = Victim::new(&daemon);
    for _ in 0..3 {
        let latency = victim.one_death();
        assert!(
            latency < Duration::from_secs(2),
            "a death took {latency:?} while another user's descriptor lingers"
        );
    }
    let status = victim.status_time();
    assert!(status <= STATUS_BOUND, "root's status took {status:?}");
    let session = victim
        .control
        .request(json!({"op": "get", "session": "x", "uid": MALLORY}));
    assert_eq!(
        session["error"]["code"], "not_found",
        "nothing was registered: {session}"
    );
}

/// Item 1, by urgent data: a descriptor whose close blocks, sent with one `MSG_OOB` byte on
/// each of 16 connections. Out of line, the daemon's read would discard that byte and
/// release the descriptor in the read, blocking a thread that serves connections per
/// byte; in line, it is refused and closed where only its sender waits.
#[test]
fn urgent_data_with_a_descriptor_stalls_nobody() {
    if !privileged("urgent_data_with_a_descriptor_stalls_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let socket = daemon.socket.to_string_lossy();
    let mut attacker = TestprocAs::spawn(MALLORY, &["urgent", &socket]);
    match attacker.read_line().as_deref() {
        Some("sent\n") => {}
        Some("unsupported\n") => {
            eprintln!(
                "urgent_data_with_a_descriptor_stalls_nobody: no MSG_OOB on Unix sockets here: nothing to test"
            );
            return;
        }
        other => panic!("the attacker said {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut victim = Victim::new(&daemon);
    for _ in 0..3 {
        let status = victim.status_time();
        assert!(status <= STATUS_BOUND, "root's status took {status:?}");
    }
    let latency = victim.one_death();
    assert!(latency < Duration::from_secs(2), "a death took {latency:?}");
}

/// Item 1, whatever way the descriptors come: with one of its closes kept blocked, another
/// user passes descriptors 253 a message within one line, on a subscription and on 40
/// connections it closes at once. The daemon takes in no more than its bound until that
/// user's closes get through (the user's connections stop reading; what a closed one left
/// queued is closed on the user's closing thread, and the connection counts against the
/// user until then), so its descriptor table holds: root still registers (which needs
/// descriptors) and sees its owner's death. Without the bound the daemon took in every
/// descriptor sent, over 10,000.
#[test]
fn passed_descriptors_never_fill_the_descriptor_table() {
    if privileged("passed_descriptors_never_fill_the_descriptor_table") {
        flood_of_passed_descriptors(&[]);
    }
}

/// The same attack when the daemon closes its copy of the lingering socket first, as on a
/// loaded machine: the attacker's own close is the one that lingers. It held up the
/// attacker's request for good (its close came before the line's newline), the test's
/// wait failing after two minutes; now it holds up a thread of the attacker's only, which
/// tries again until the daemon's close is the one that lingers.
#[test]
fn a_flood_whose_own_close_lingers_still_sends_its_request() {
    if privileged("a_flood_whose_own_close_lingers_still_sends_its_request") {
        flood_of_passed_descriptors(&["late-first"]);
    }
}

/// The flood of passed descriptors of [`passed_descriptors_never_fill_the_descriptor_table`],
/// `testproc flood` run with `options`.
fn flood_of_passed_descriptors(options: &[&str]) {
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let fd_dir = format!("/proc/{}/fd", daemon.pid());
    let open = move || std::fs::read_dir(&fd_dir).map_or(0, Iterator::count);
    let before = open();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = std::thread::spawn({
        let (sampling, open) = (Arc::clone(&sampling), open.clone());
        move || {
            let mut most = 0;
            while sampling.load(Ordering::Relaxed) {
                most = most.max(open());
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        }
    });
    let socket = daemon.socket.to_string_lossy();
    let mut attacker = TestprocAs::spawn(MALLORY, &[&["flood", &*socket], options].concat());
    let sent = attacker.read_line().expect("what the attacker sent");
    let sent: usize = sent
        .trim()
        .strip_prefix("sent ")
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| {
            panic!("the attacker could not keep a close in the daemon lingering: {sent:?}")
        });
    if options.contains(&"late-first") {
        assert!(
            in_close(attacker.pid()) > 0,
            "no thread of the attacker's waits in its lingering close"
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let latency = Victim::new(&daemon).one_death();
    sampling.store(false, Ordering::Relaxed);
    let most = sampler.join().expect("the sampler");
    eprintln!("descriptors open: {before} before, {most} at most; {sent} passed");
    assert!(sent >= 2 * 253, "the attack sent {sent} descriptors");
    assert!(
        most < before + 1_000,
        "{most} descriptors open at most (before: {before}; {sent} passed)"
    );
    assert!(latency < Duration::from_secs(2), "a death took {latency:?}");
    drop(attacker);
    assert!(
        eventually(Duration::from_secs(20), || open() < before + 20),
        "once the attacker is gone its descriptors are closed: {} open (before: {before})",
        open()
    );
}

/// How many threads of `pid` wait in close(2).
fn in_close(pid: u32) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the attacker's threads");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("syscall")).ok())
        .filter(|syscall| syscall.split(' ').next() == Some(&libc::SYS_close.to_string()))
        .count()
}

/// Item 1, without end: another user keeps sending lingering sockets, each one's close
/// blocked while its sender lives (a dozen at a time); a victim's deaths hold within twice
/// their baseline, and root's `status` within its bound.
#[test]
fn lingering_closes_in_a_loop_stall_nobody() {
    if !privileged("lingering_closes_in_a_loop_stall_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let socket = daemon.socket.to_string_lossy().into_owned();
    holds_while(&daemon, "lingering closes in a loop", || {
        let lingering = Arc::new(Mutex::new(VecDeque::new()));
        Attack::rounds(&daemon, 2, move |_| {
            // At the lowest priority, as every attacker's process here, and at a pace: the
            // blocked closes are the attack, not the machine's time spent forking senders.
            let line = r#"{"op":"status"}"#;
            let mut sender = TestprocAs::spawn_niced(MALLORY, 19, &["linger", &socket, line]);
            assert_ok(&sender.read_line().expect("the daemon's reply"));
            std::thread::sleep(Duration::from_millis(100));
            let mut lingering = lingering.lock().unwrap_or_else(PoisonError::into_inner);
            lingering.push_back(sender);
            // The oldest sender goes, and its close with it: fewer closes than the
            // daemon's bound per uid stay pending, so the attacker's own requests are still
            // read and the loop goes on.
            while lingering.len() > 12 {
                lingering.pop_front();
            }
        })
    });
}

/// Item 4: `processes` over a tree of 4,000 processes, looped by another user on eight
/// connections.
#[test]
fn processes_of_a_big_tree_stall_nobody() {
    if !privileged("processes_of_a_big_tree_stall_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let tree = tree_of_mallory(4_000);
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    let reply = mallory
        .request(&json!({"op": "register", "session": "big", "owner": {"pid": tree.pid()}}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    mallory.wait_for_tree("big", 4_001, Duration::from_secs(20));
    holds_while(&daemon, "processes over 4,000", || {
        Attack::looping(
            &daemon,
            8,
            json!({"op": "processes", "session": "big", "limit": 10_000}),
        )
    });
}

/// Mallory's session `id` owned by `owner`, registered on `client`.
fn register_mallorys(client: &mut ClientAs, id: &str, owner: u32, on_end: &str) {
    let request =
        json!({"op": "register", "session": id, "owner": {"pid": owner}, "on_end": on_end});
    let reply = client.request(&request).expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
}

/// `whose` of the last of a chain of 250 processes, each the child of the one before.
#[test]
fn whose_of_a_deep_chain_stalls_nobody() {
    if !privileged("whose_of_a_deep_chain_stalls_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let mut chain = TestprocAs::spawn(MALLORY, &["chain", "250"]);
    let last: u32 = chain
        .read_line()
        .and_then(|line| line.trim().parse().ok())
        .expect("the chain's last pid");
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    register_mallorys(&mut mallory, "top", chain.pid(), "leave");
    holds_while(&daemon, "whose over 250 ancestors", || {
        Attack::looping(&daemon, 8, json!({"op": "whose", "pid": last}))
    });
}

/// The activity sampler reading 100 of another user's trees of 21 processes every 100 ms,
/// while that user loops `touch` declarations (an agent's hooks, gone wild): the sampling
/// and the declarations run off the path a death takes.
#[test]
fn sampling_many_trees_stalls_nobody() {
    if !privileged("sampling_many_trees_stalls_nobody") {
        return;
    }
    let _alone = alone();
    const TREES: usize = 100;
    let daemon = Daemon::start(&["--activity-interval", "100ms"]);
    open_socket_to_everyone(&daemon);
    let trees: Vec<TestprocAs> = (0..TREES).map(|_| tree_of_mallory(20)).collect();
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    holds_while(&daemon, "activity sampling of 100 trees of 21", || {
        for (n, tree) in trees.iter().enumerate() {
            register_mallorys(&mut mallory, &format!("agent-{n}"), tree.pid(), "leave");
        }
        Attack::looping(
            &daemon,
            4,
            json!({"op": "touch", "session": "agent-0", "turn": "start", "tool": "Bash"}),
        )
    });
    let listed = mallory
        .request(&json!({"op": "get", "session": "agent-0"}))
        .expect("a reply");
    assert_eq!(
        listed["session"]["activity"]["evidence"]["processes"], 21,
        "the trees were sampled: {listed}"
    );
}

/// `lock_list` looped over 10,240 locks of one user.
#[test]
fn lock_listings_stall_nobody() {
    if !privileged("lock_listings_stall_nobody") {
        return;
    }
    let _alone = alone();
    const LOCKS: usize = 10_240;
    let daemon = Daemon::start(&["--max-locks-per-uid", "20000"]);
    open_socket_to_everyone(&daemon);
    let holder = TestprocAs::spawn(MALLORY, &["tree", "0"]);
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    let per_session = 256;
    for s in 0..LOCKS / per_session {
        let id = format!("holder-{s}");
        register_mallorys(&mut mallory, &id, holder.pid(), "leave");
        for l in 0..per_session {
            let name = format!("{:0>190}", s * per_session + l);
            mallory.send(&json!({"op": "lock_acquire", "session": id, "name": name}));
        }
        for _ in 0..per_session {
            let reply = mallory.next_line().expect("a reply");
            assert_eq!(reply["ok"], true, "{reply}");
        }
    }
    holds_while(&daemon, "lock_list over 10,240 locks", || {
        Attack::looping(&daemon, 8, json!({"op": "lock_list", "limit": 10_000}))
    });
}

/// Item 7 of the hardening issue as a flood: a user taking and giving back locks of
/// long, new names as fast as four connections go, each a commit and two events.
#[test]
fn lock_floods_stall_nobody() {
    if !privileged("lock_floods_stall_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let holder = TestprocAs::spawn(MALLORY, &["tree", "0"]);
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    register_mallorys(&mut mallory, "flood", holder.pid(), "leave");
    holds_while(&daemon, "lock acquire and release flood", || {
        Attack::rounds(&daemon, 4, |client| {
            let name = format!("{:0>190}-{}-{}", "", client.process.pid(), client.round);
            let take = json!({"op": "lock_acquire", "session": "flood", "name": name});
            assert_ok(&client.raw_request(&take));
            let give = json!({"op": "lock_release", "session": "flood", "name": name});
            assert_ok(&client.raw_request(&give));
        })
    });
}

/// A user other than the attacker.
const ALICE: u32 = 61_031;

/// Kills every process on drop that is still the same one.
struct KillAll(Vec<Fingerprint>);

impl Drop for KillAll {
    fn drop(&mut self) {
        for process in &self.0 {
            process.kill();
        }
    }
}

/// Item 5: a reap held a pidfd for each survivor for the whole grace, so 1,100 survivors of
/// one user's session that ignore SIGTERM, with the daemon at 1,024 descriptors, left
/// another user unable to register. The reap holds a bounded share; the others are
/// verified again through a new pidfd before SIGKILL.
#[test]
fn a_reap_with_more_survivors_than_descriptors_stalls_nobody() {
    if !privileged("a_reap_with_more_survivors_than_descriptors_stalls_nobody") {
        return;
    }
    let _alone = alone();
    const SURVIVORS: usize = 1_100;
    const GRACE: Duration = Duration::from_secs(15);
    const MARGIN: Duration = Duration::from_secs(60);
    let daemon = Daemon::start_under(&["prlimit", "--nofile=1024:1024", "--"], None, &[]);
    open_socket_to_everyone(&daemon);
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    let mut victim = Victim::new(&daemon);
    let baseline = victim.death_latency();
    let mut owner = TestprocAs::spawn(MALLORY, &["survivors", &SURVIVORS.to_string()]);
    let survivors = KillAll(
        (0..SURVIVORS)
            .map(|_| {
                let pid = owner.read_line().and_then(|line| line.trim().parse().ok());
                Fingerprint::of(pid.expect("a survivor's pid"))
            })
            .collect(),
    );
    assert_eq!(owner.read_line().as_deref(), Some("ready\n"));
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    let reply = mallory
        .request(
            &json!({"op": "register", "session": "crowd", "owner": {"pid": owner.pid()},
            "on_end": "terminate", "grace_ms": GRACE.as_millis() as u64}),
        )
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    mallory.wait_for_tree("crowd", SURVIVORS + 1, MARGIN);

    // The owner exits; each survivor prints `term` when SIGTERM reaches it.
    owner.to = None;
    let said = owner.into_lines();
    let term_within = |wait| said.recv_timeout(wait).is_ok_and(|line| line == "term\n");
    // Once SIGTERM has reached them all, or no more for a while (a daemon out of
    // descriptors then has signalled what it could).
    let mut signalled = 0;
    while signalled < SURVIVORS && term_within(Duration::from_secs(4)) {
        signalled += 1;
    }

    // Within the grace, another user's deaths are as quick as before, another user is
    // served, and the daemon keeps descriptors spare.
    let attacked = victim.death_latency();
    eprintln!(
        "a reap of {SURVIVORS}: death → event median {baseline:?} alone, {attacked:?} in its grace"
    );
    assert!(
        attacked <= latency_bound(baseline),
        "a victim's death took {attacked:?} at the median in another user's reap, against \
         {baseline:?} before"
    );
    let alices = TestprocAs::spawn(ALICE, &["tree", "0"]);
    let mut alice = ClientAs::connect(&daemon, ALICE);
    let reply = alice
        .request(&json!({"op": "register", "session": "meanwhile", "owner": {"pid": alices.pid()}}))
        .expect("a reply to another user's register");
    assert_eq!(reply["ok"], true, "{reply}");
    let open = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .expect("the daemon's descriptors")
        .count();
    assert!(
        survivors.0.iter().all(Fingerprint::is_running),
        "the grace was over before another user registered"
    );
    assert!(open <= 512, "the daemon holds {open} descriptors of 1,024");
    while signalled < SURVIVORS && term_within(MARGIN) {
        signalled += 1;
    }
    assert_eq!(signalled, SURVIVORS, "survivors that got SIGTERM");

    let reaped = stream.next_event_of("session.reaped", "crowd", GRACE + MARGIN);
    let outcome = &reaped["reaped"];
    let mut killed: Vec<u64> = outcome["killed"]
        .as_array()
        .map(|pids| pids.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    killed.sort_unstable();
    let mut expected: Vec<u64> = survivors.0.iter().map(|s| u64::from(s.pid)).collect();
    expected.sort_unstable();
    assert!(
        killed == expected,
        "not every survivor was SIGKILLed: {outcome}"
    );
    for list in ["terminated", "exited", "failed"] {
        assert_eq!(outcome[list], json!([]), "{list}: {outcome}");
    }
    assert!(
        integration_tests::eventually(MARGIN, || !survivors.0.iter().any(Fingerprint::is_running)),
        "survivors still run after the reap"
    );
}

/// Item 6: scrapes were served one at a time, each connection given 5 s to send its
/// request, so four silent connections delayed a real scrape to 19.8 s. However many
/// connect and say nothing, a real scrape is answered within a second, and each silent
/// connection is dropped within seconds.
#[test]
fn silent_metrics_connections_hold_up_no_scrape() {
    const SILENT: usize = 100;
    let _alone = alone();
    let daemon = Daemon::start(&["--metrics-listen", "127.0.0.1:0"]);
    let addr = daemon.metrics_addr();
    let mut victim = Victim::new(&daemon);
    let baseline = victim.death_latency();
    let silent: Vec<TcpStream> = (0..SILENT)
        .map(|_| TcpStream::connect(&addr).expect("connect to the metrics listener"))
        .collect();
    let attacked = victim.death_latency();
    assert!(
        attacked <= latency_bound(baseline),
        "a death took {attacked:?} at the median beside {SILENT} silent metrics \
         connections, against {baseline:?} before"
    );
    for round in 0..3 {
        let asked = Instant::now();
        let response = integration_tests::scrape(&addr, "/metrics");
        let took = asked.elapsed();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            took < Duration::from_secs(1),
            "scrape {round} took {took:?} beside {SILENT} silent connections"
        );
    }
    for (n, mut connection) in silent.into_iter().enumerate() {
        connection
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut byte = [0u8; 1];
        let read = std::io::Read::read(&mut connection, &mut byte);
        let closed = match &read {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        };
        assert!(
            closed,
            "silent connection {n} was not closed within 10 s: {read:?}"
        );
    }
}

/// Registering over and over an owner with a 4,000-process tree: each registration
/// follows the tree.
#[test]
fn registrations_of_a_big_tree_stall_nobody() {
    if !privileged("registrations_of_a_big_tree_stall_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let tree = tree_of_mallory(4_000);
    let owner = json!({"pid": tree.pid()});
    holds_while(&daemon, "registrations over 4,000", || {
        Attack::looping(
            &daemon,
            4,
            json!({"op": "register", "session": "again", "owner": owner}),
        )
    });
}
/// `end` with `terminate`, looped over sessions of an owner with a 4,000-process tree:
/// each end lists the tree's survivors and starts a reap.
#[test]
fn ends_of_a_big_tree_stall_nobody() {
    if !privileged("ends_of_a_big_tree_stall_nobody") {
        return;
    }
    let _alone = alone();
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let tree = tree_of_mallory(4_000);
    let pid = tree.pid();
    holds_while(&daemon, "end --terminate over 4,000", || {
        Attack::rounds(&daemon, 4, move |client| {
            let id = format!("end-{}-{}", client.process.pid(), client.round);
            let register = json!({"op": "register", "session": id, "owner": {"pid": pid}});
            assert_ok(&client.raw_request(&register));
            let end = json!({"op": "end", "session": id, "terminate": true});
            assert_ok(&client.raw_request(&end));
        })
    });
}
