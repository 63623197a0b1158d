//! Every death ends its session with the facts the kernel knew: with the default sources
//! (eBPF and pidfd together), each ended session carries its owner's exit status, whichever
//! source saw the death first.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{Daemon, Orphan, binary, privileged, start_ticks};
use serde_json::{Value, json};

const OWNERS: usize = 100;
/// How long all endings may take to arrive (generous: shared machines).
const ARRIVAL: Duration = Duration::from_secs(30);

/// How one owner dies, and the status its session must show.
#[derive(Debug, Clone, Copy)]
enum Death {
    Killed,
    Exits(u8),
}

impl Death {
    fn expected(self) -> Value {
        match self {
            Death::Killed => json!({"kind": "signaled", "signal": 9, "core_dumped": false}),
            Death::Exits(code) => json!({"kind": "exited", "code": code}),
        }
    }
}

/// An owner that is either an orphan (reparented to init, reaped whenever init gets to it)
/// or a child of this test, which a thread of its own reaps the moment it dies.
enum Owner {
    Orphan(Orphan),
    Child {
        pid: u32,
        stdin: Option<std::process::ChildStdin>,
        reaper: std::thread::JoinHandle<()>,
    },
}

impl Owner {
    fn child(code: u8) -> Owner {
        let mut child: Child = Command::new(binary("testproc"))
            .args(["exit", &code.to_string()])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn testproc: {e}"));
        let pid = child.id();
        let stdin = child.stdin.take();
        let reaper = std::thread::spawn(move || {
            child.wait().expect("reap the child owner");
        });
        Owner::Child { pid, stdin, reaper }
    }

    fn pid(&self) -> u32 {
        match self {
            Owner::Orphan(orphan) => orphan.pid,
            Owner::Child { pid, .. } => *pid,
        }
    }

    fn die(&mut self, death: Death) {
        match death {
            // SAFETY: signalling a process this test started and that is still alive.
            Death::Killed => unsafe {
                libc::kill(self.pid() as i32, libc::SIGKILL);
            },
            Death::Exits(_) => match self {
                Owner::Orphan(orphan) => orphan.release(),
                Owner::Child { stdin, .. } => *stdin = None,
            },
        }
    }
}

/// Half the owners are SIGKILLed, half exit with codes of their own; half are orphans, half
/// children reaped at once. Every session must end `owner_exited` with exactly that status.
#[test]
fn every_death_ends_with_its_status_under_the_default_sources() {
    if !privileged("every_death_ends_with_its_status_under_the_default_sources") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut stream = daemon.connect();
    let ack = stream.request(json!({"op": "subscribe"}));
    assert_eq!(ack["ok"], true, "{ack}");

    let mut owners = Vec::new();
    for i in 0..OWNERS {
        let code = (i + 1) as u8;
        let death = if i % 2 == 0 {
            Death::Killed
        } else {
            Death::Exits(code)
        };
        let owner = if i < OWNERS / 2 {
            Owner::Orphan(Orphan::spawn(&["exit", &code.to_string()]))
        } else {
            Owner::child(code)
        };
        assert!(
            start_ticks(owner.pid()).is_some(),
            "owner {} is not running",
            owner.pid()
        );
        let session = format!("s{i}");
        let reply = daemon
            .request(json!({"op": "register", "session": session, "owner": {"pid": owner.pid()}}));
        assert_eq!(reply["session"]["phase"], "active", "{reply}");
        owners.push((session, death, owner));
    }
    for (_, death, owner) in &mut owners {
        owner.die(*death);
    }

    let mut ended: HashMap<String, Value> = HashMap::new();
    let deadline = Instant::now() + ARRIVAL;
    while ended.len() < OWNERS {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let line = stream.next_within(remaining).unwrap_or_else(|| {
            panic!(
                "only {} of {OWNERS} sessions ended within {ARRIVAL:?}",
                ended.len()
            )
        });
        let event = &line["event"];
        if event["kind"] == "session.ended" {
            ended.insert(event["session"].as_str().unwrap().to_owned(), event.clone());
        }
    }
    let mut by_source: HashMap<String, usize> = HashMap::new();
    for (session, death, owner) in owners {
        let event = &ended[&session];
        assert_eq!(event["reason"], "owner_exited", "{session}: {event}");
        assert_eq!(
            event["exit"],
            death.expected(),
            "{session} ({death:?}) ended without its status: {event}"
        );
        // The stored session agrees with the event.
        let stored = daemon.request(json!({"op": "get", "session": session}));
        assert_eq!(stored["session"]["exit"], death.expected(), "{stored}");
        *by_source
            .entry(event["detected_by"].as_str().unwrap_or("none").to_owned())
            .or_default() += 1;
        if let Owner::Child { reaper, .. } = owner {
            reaper.join().expect("the reaper thread");
        }
    }
    eprintln!("sessions ended by source: {by_source:?}");
    let eventually_ebpf = by_source.get("ebpf").copied().unwrap_or(0);
    assert!(
        eventually_ebpf > 0,
        "eBPF saw none of {OWNERS} deaths: {by_source:?}"
    );
}

/// Registers an orphan with the daemon, lets it exit with status 3 and returns its
/// `session.ended` event, with `CLOCK_MONOTONIC` just before the release and just after
/// the event was read.
fn one_death(daemon: &Daemon) -> (u64, Value, u64) {
    let mut stream = daemon.connect();
    stream.request(json!({"op": "subscribe"}));
    let mut owner = Orphan::spawn(&["exit", "3"]);
    daemon.request(json!({"op": "register", "session": "t", "owner": {"pid": owner.pid}}));
    let released = monotonic_ns();
    owner.release();
    loop {
        let line = stream.next_within(ARRIVAL).expect("the session must end");
        if line["event"]["kind"] == "session.ended" {
            break (released, line["event"].clone(), monotonic_ns());
        }
    }
}

fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The kernel's exit time travels with the event: `died_ms` (eBPF) is never after
/// `observed_ms`, which is never after the commit (`at_ms`).
#[test]
fn the_event_says_when_the_owner_died() {
    if !privileged("the_event_says_when_the_owner_died") {
        return;
    }
    let daemon = Daemon::start(&["--sources", "ebpf"]);
    let (_, ended, _) = one_death(&daemon);
    let (died, observed, committed) = (
        ended["died_ms"].as_i64().expect("died_ms from eBPF"),
        ended["observed_ms"].as_i64().expect("observed_ms"),
        ended["at_ms"].as_i64().expect("at_ms"),
    );
    assert!(
        died <= observed && observed <= committed,
        "died {died}, observed {observed}, committed {committed}: {ended}"
    );
    assert_eq!(ended["detected_by"], "ebpf", "{ended}");
    assert!(
        ended.get("hops").is_none(),
        "hops only with --trace-hops: {ended}"
    );
}

/// With `--trace-hops` the event carries the monotonic time of every hop, in order,
/// between the owner's release and the subscriber's read.
#[test]
fn trace_hops_stamps_every_hop_in_order() {
    if !privileged("trace_hops_stamps_every_hop_in_order") {
        return;
    }
    let daemon = Daemon::start(&["--sources", "ebpf", "--trace-hops"]);
    let (released, ended, read) = one_death(&daemon);
    let hops = &ended["hops"];
    let stamp = |name: &str| {
        hops[name]
            .as_u64()
            .unwrap_or_else(|| panic!("hops.{name} missing: {ended}"))
    };
    let order = [
        released,
        stamp("died_ns"),
        stamp("read_ns"),
        stamp("committed_ns"),
        stamp("published_ns"),
        read,
    ];
    assert!(
        order.windows(2).all(|pair| pair[0] <= pair[1]),
        "release, death, read, commit, publish and the subscriber's read out of order: {order:?} {ended}"
    );
}

/// Status says what each source can do here, and that eBPF proved it sees deaths.
#[test]
fn status_reports_the_self_test_and_the_facts_each_source_gives() {
    if !privileged("status_reports_the_self_test_and_the_facts_each_source_gives") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let reply = daemon.request(json!({"op": "status"}));
    let sources = reply["status"]["monitor"]["sources"].as_array().unwrap();
    let source = |name: &str| {
        sources
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {reply}"))
    };
    assert_eq!(source("ebpf")["state"], "active", "{reply}");
    assert_eq!(source("ebpf")["self_test"]["passed"], true, "{reply}");
    assert_eq!(source("ebpf")["exit_status"], "always", "{reply}");
    assert_eq!(source("pidfd")["state"], "active", "{reply}");
    assert!(
        matches!(
            source("pidfd")["exit_status"].as_str(),
            Some("after_reap" | "never")
        ),
        "{reply}"
    );
    assert_eq!(source("procpoll")["state"], "standby", "{reply}");
}
