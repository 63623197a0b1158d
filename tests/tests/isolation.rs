//! No user can stall another's deaths: while another uid attacks the daemon with work
//! whose size or timing it chooses, a victim's death → event latency stays within twice
//! its baseline, measured in the same run, and root's `status` answers within 100 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use integration_tests::{
    ClientAs, Conn, Daemon, Orphan, TestprocAs, open_socket_to_everyone, privileged,
};
use serde_json::{Value, json};

/// The attacker.
const MALLORY: u32 = 61_030;
/// Deaths timed per measurement.
const DEATHS: usize = 15;
/// How long root's `status` may take while another user attacks.
const STATUS_BOUND: Duration = Duration::from_millis(100);

/// Root's view: a control connection and a subscription.
struct Victim {
    control: Conn,
    stream: Conn,
    round: usize,
}

impl Victim {
    fn new(daemon: &Daemon) -> Victim {
        let mut stream = daemon.connect();
        assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
        Victim {
            control: daemon.connect(),
            stream,
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
        let owner = Orphan::spawn(&["exit", "0"]);
        let reply = self
            .control
            .request(json!({"op": "register", "session": session, "owner": {"pid": owner.pid}}));
        assert_eq!(reply["ok"], true, "{reply}");
        loop {
            let line = self.stream.next_line().expect("the stream is open");
            if line["event"]["session"] == session.as_str() {
                break;
            }
        }
        let killed = Instant::now();
        // SAFETY: killing the orphan this test started.
        unsafe { libc::kill(owner.pid as i32, libc::SIGKILL) };
        loop {
            let line = self
                .stream
                .next_within(Duration::from_secs(30))
                .unwrap_or_else(|| panic!("no end of {session} within 30 s"));
            if line["event"]["session"] == session.as_str()
                && line["event"]["kind"] == "session.ended"
            {
                return killed.elapsed();
            }
        }
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
        attacked <= baseline * 2,
        "{what}: a victim's death took {attacked:?} at the median under attack, against \
         {baseline:?} alone"
    );
    assert!(
        status <= STATUS_BOUND,
        "{what}: root's status took {status:?} under attack"
    );
}

/// Threads of the attacker looping a request, each on a connection of its own.
struct Attack {
    stop: Arc<AtomicBool>,
    loops: Vec<std::thread::JoinHandle<usize>>,
}

impl Attack {
    fn looping(daemon: &Daemon, connections: usize, request: Value) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let loops = (0..connections)
            .map(|_| {
                let mut client = ClientAs::connect(daemon, MALLORY);
                let (stop, request) = (Arc::clone(&stop), request.clone());
                std::thread::spawn(move || {
                    let mut rounds = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let reply = client.request(&request).expect("a reply");
                        assert_eq!(reply["ok"], true, "{reply}");
                        rounds += 1;
                    }
                    rounds
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

/// Item 4: `processes` over a tree of 4,000 processes, looped by another user on eight
/// connections.
#[test]
fn processes_of_a_big_tree_stall_nobody() {
    if !privileged("processes_of_a_big_tree_stall_nobody") {
        return;
    }
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let tree = tree_of_mallory(4_000);
    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    let reply = mallory
        .request(&json!({"op": "register", "session": "big", "owner": {"pid": tree.pid()}}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    let listed = mallory
        .request(&json!({"op": "processes", "session": "big"}))
        .expect("a reply");
    let count = listed["processes"].as_array().map_or(0, Vec::len);
    assert_eq!(count, 4_001, "the owner and its children");
    holds_while(&daemon, "processes over 4,000", || {
        Attack::looping(&daemon, 8, json!({"op": "processes", "session": "big"}))
    });
}
