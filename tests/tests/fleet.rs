//! The fleet mirror (`livenessd --etcd`, docs/fleet.md) against a real etcd on loopback,
//! with daemons standing for hosts (each its own state directory and host id) on this
//! machine: presence on a lease, ACTIVE sessions gone within milliseconds of their end and
//! the end kept, and an etcd that is down, hung or restarted costing deaths nothing and
//! etcd nothing once it is back (no write lost, none doubled).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use integration_tests::{
    ClientAs, Conn, Daemon, Etcd, Fingerprint, Orphan, UserProcess, binary, eventually, next_event,
    open_socket_to_everyone, process_of, subscribe,
};
use serde_json::{Value, json};

/// How long a write may take to show in etcd in these tests (a loaded machine).
const MIRRORED: Duration = Duration::from_secs(10);
/// The bound a session's key must be gone within after its owner's SIGKILL. The mirror's
/// own time is one etcd transaction (a few ms here); the bound leaves room for a machine
/// shared with other builds.
const KEY_GONE: Duration = Duration::from_millis(500);
/// A user with nothing to do with the fleet.
const MALLORY: u32 = 61_061;

fn host(etcd: &Etcd, id: &str, ttl: &str) -> Daemon {
    Daemon::start(&["--etcd", &etcd.url(), "--host-id", id, "--etcd-ttl", ttl])
}

fn status(daemon: &Daemon) -> Value {
    let reply = daemon.request(json!({"op": "status"}));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["status"].clone()
}

fn cluster(daemon: &Daemon) -> Value {
    status(daemon)["cluster"].clone()
}

/// Waits until the keys under `prefix` are `expected`; fails with what etcd has.
fn wait_keys(etcd: &Etcd, prefix: &str, expected: &[String]) {
    let mut seen = Vec::new();
    let reached = eventually(MIRRORED, || {
        seen = etcd.keys(prefix);
        seen == expected
    });
    assert!(
        reached,
        "under {prefix}: expected {expected:?}, etcd has {seen:?}"
    );
}

/// Waits until the daemon's mirror is connected and etcd has every event.
fn wait_caught_up(daemon: &Daemon) {
    let caught_up = eventually(MIRRORED, || {
        let cluster = cluster(daemon);
        cluster["connected"] == true && cluster["behind"] == 0
    });
    assert!(caught_up, "{}", cluster(daemon));
}

fn keys(prefix: &str, names: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = names.iter().map(|n| format!("{prefix}{n}")).collect();
    keys.sort();
    keys
}

fn register(daemon: &Daemon, session: &str, pid: u32) {
    let reply = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": pid}, "labels": {"team": "infra"}
    }));
    assert_eq!(reply["ok"], true, "{reply}");
}

/// `etcdctl watch --prefix PREFIX`, each line with when it was read.
fn watch_lines(etcd: &Etcd, prefix: &str) -> (Child, Receiver<(Instant, String)>) {
    let mut watch = etcd.watch(prefix);
    let stdout = watch.stdout.take().expect("piped");
    let (sink, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sink.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    (watch, lines)
}

/// Every ended record under `prefix` was written once: a replay after an outage writes
/// nothing twice.
fn assert_written_once(etcd: &Etcd, prefix: &str) {
    for key in etcd.keys(prefix) {
        assert_eq!(etcd.version(&key), 1, "{key} was written more than once");
    }
}

#[test]
fn hosts_are_online_while_their_daemons_run_and_offline_after() {
    let etcd = Etcd::started();
    let mut h1 = host(&etcd, "h1", "5s");
    let mut h2 = host(&etcd, "h2", "3s");
    let _h3 = host(&etcd, "h3", "3s");
    wait_keys(
        &etcd,
        "/liveness/hosts/",
        &keys("/liveness/hosts/", &["h1", "h2", "h3"]),
    );
    let record = &etcd.get_prefix("/liveness/hosts/h1")[0].1;
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(record["host_id"], "h1", "{record}");
    assert_eq!(record["boot_id"], boot_id.trim(), "{record}");
    assert_eq!(record["store_id"], status(&h1)["store_id"], "{record}");

    // A clean stop revokes the lease: offline at once, not after the 5 s TTL.
    h1.stop();
    let stopped = Instant::now();
    wait_keys(
        &etcd,
        "/liveness/hosts/",
        &keys("/liveness/hosts/", &["h2", "h3"]),
    );
    assert!(
        stopped.elapsed() < Duration::from_secs(2),
        "h1 went offline only after {:?}",
        stopped.elapsed()
    );

    // A killed daemon cannot say goodbye: its host stays until the lease's TTL runs out.
    h2.kill9();
    let killed = Instant::now();
    assert_eq!(
        etcd.keys("/liveness/hosts/h2"),
        ["/liveness/hosts/h2"],
        "the lease of a killed daemon outlives it"
    );
    wait_keys(
        &etcd,
        "/liveness/hosts/",
        &keys("/liveness/hosts/", &["h3"]),
    );
    assert!(
        killed.elapsed() < Duration::from_secs(3 + 3),
        "h2 stayed online {:?} after its daemon's death, with a TTL of 3 s",
        killed.elapsed()
    );
}

#[test]
fn a_sessions_key_goes_within_milliseconds_of_its_owners_death_and_its_end_is_kept() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "10s");
    let h2 = host(&etcd, "h2", "10s");
    let owner = Orphan::spawn(&["exit", "0"]);
    register(&h1, "build-1", owner.pid);
    let other = Orphan::spawn(&["exit", "0"]);
    register(&h2, "build-1", other.pid);
    let key = "/liveness/sessions/h1/0/build-1";
    wait_keys(
        &etcd,
        "/liveness/sessions/",
        &[key.into(), "/liveness/sessions/h2/0/build-1".into()],
    );
    let record = &etcd.get_prefix(key)[0].1;
    assert_eq!(record["session"]["id"], "build-1", "{record}");
    assert_eq!(record["session"]["phase"], "active", "{record}");
    assert_eq!(record["session"]["labels"]["team"], "infra", "{record}");
    assert_eq!(record["session"]["owner"]["pid"], owner.pid, "{record}");
    assert_eq!(record["store_id"], status(&h1)["store_id"], "{record}");
    assert_eq!(record["seq"], 1, "{record}");

    // A watcher, as another host's tool would have one, ready once it saw a write.
    let (mut watch, lines) = watch_lines(&etcd, "/liveness/sessions/h1/");
    let marker = Orphan::spawn(&["exit", "0"]);
    let mut ready = false;
    for round in 0..20 {
        register(&h1, &format!("marker-{round}"), marker.pid);
        while let Ok((_, line)) = lines.recv_timeout(Duration::from_millis(500)) {
            ready |= line.contains("marker");
        }
        if ready {
            break;
        }
    }
    assert!(ready, "the watcher never saw a write");
    let killed = Instant::now();
    Fingerprint::of(owner.pid).kill();
    let gone = loop {
        let (at, line) = lines.recv_timeout(MIRRORED).expect("the key's deletion");
        if line == "DELETE" {
            let (_, deleted) = lines.recv_timeout(MIRRORED).expect("the deleted key");
            assert_eq!(deleted, key);
            break at - killed;
        }
    };
    let _ = watch.kill();
    let _ = watch.wait();
    eprintln!("owner SIGKILLed -> its key deleted, as a watcher sees it: {gone:?}");
    assert!(
        gone < KEY_GONE,
        "the key went {gone:?} after the owner's death"
    );

    // The end, with its facts and cause, kept under ended/ on its own lease; the other
    // host's session of the same id is untouched.
    let ended = h1.wait_ended("build-1");
    wait_keys(
        &etcd,
        "/liveness/ended/",
        &["/liveness/ended/h1/0/build-1".into()],
    );
    let record = &etcd.get_prefix("/liveness/ended/h1/0/build-1")[0].1;
    assert_eq!(record["event"]["kind"], "session.ended", "{record}");
    assert_eq!(record["event"]["reason"], ended["reason"], "{record}");
    assert_eq!(record["event"]["cause"]["kind"], "signal", "{record}");
    assert_eq!(record["event"]["cause"]["signal"], 9, "{record}");
    assert_eq!(record["seq"], record["event"]["seq"], "{record}");
    let lease = etcd.ctl(&["get", "/liveness/ended/h1/0/build-1", "-w", "json"]);
    let lease: Value = serde_json::from_slice(&lease.stdout).unwrap();
    assert_ne!(
        lease["kvs"][0]["lease"],
        Value::Null,
        "the record expires with a lease"
    );
    assert_eq!(
        etcd.keys("/liveness/sessions/"),
        [
            etcd.keys("/liveness/sessions/h1/0/marker-"),
            vec!["/liveness/sessions/h2/0/build-1".to_owned()]
        ]
        .concat()
    );
}

/// etcd's revision: one more for every transaction that wrote.
fn revision(etcd: &Etcd) -> u64 {
    let got = etcd.ctl(&["get", "/", "-w", "json"]);
    let got: Value = serde_json::from_slice(&got.stdout).expect("etcdctl's JSON");
    got["header"]["revision"].as_u64().expect("a revision")
}

/// Events that follow one another closely go to etcd in a few transactions, each key
/// written as the last of them left it (etcd refuses a transaction that names a key
/// twice): sessions registered then ended within one batch leave no session key, only
/// their ends, each written once.
#[test]
fn a_burst_goes_to_etcd_in_few_transactions_each_key_as_the_last_event_left_it() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "10s");
    wait_caught_up(&h1);
    let owner = Orphan::spawn(&["exit", "0"]);
    let before = revision(&etcd);
    let mut conn = h1.connect();
    const SESSIONS: usize = 200;
    for n in 0..SESSIONS {
        let registered = conn.request(json!({
            "op": "register", "session": format!("burst-{n}"), "owner": {"pid": owner.pid},
        }));
        assert_eq!(registered["ok"], true, "{registered}");
        if n % 2 == 0 {
            let ended = conn.request(json!({"op": "end", "session": format!("burst-{n}")}));
            assert_eq!(ended["ok"], true, "{ended}");
        }
    }
    wait_caught_up(&h1);
    let kept: Vec<String> = (1..SESSIONS)
        .step_by(2)
        .map(|n| format!("burst-{n}"))
        .collect();
    let mut expected: Vec<String> = kept
        .iter()
        .map(|id| format!("/liveness/sessions/h1/0/{id}"))
        .collect();
    expected.sort();
    assert_eq!(etcd.keys("/liveness/sessions/"), expected);
    let ended = etcd.keys("/liveness/ended/h1/");
    assert_eq!(ended.len(), SESSIONS / 2, "{ended:?}");
    assert_written_once(&etcd, "/liveness/ended/");
    // 300 events; without gathering, as many transactions (and revisions). How many
    // gather depends on the machine's speed: some must.
    let transactions = revision(&etcd) - before;
    eprintln!("300 events in {transactions} transactions");
    assert!(
        transactions < 250,
        "{transactions} transactions for 300 events"
    );
}

#[test]
fn an_etcd_down_at_start_hung_or_restarted_delays_no_death_and_loses_or_doubles_nothing() {
    let mut etcd = Etcd::new();
    let mut h1 = host(&etcd, "h1", "3s");
    let cluster_now = cluster(&h1);
    assert_eq!(cluster_now["connected"], false, "{cluster_now}");
    assert_eq!(cluster_now["mirrored_seq"], Value::Null, "{cluster_now}");
    let text = h1.cli(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Cluster: disconnected"), "{text}");

    // While etcd is down the daemon serves as ever.
    let a = Orphan::spawn(&["exit", "0"]);
    register(&h1, "a", a.pid);
    let reply = h1.request(json!({"op": "end", "session": "a"}));
    assert_eq!(reply["ok"], true, "{reply}");
    let b = Orphan::spawn(&["exit", "0"]);
    register(&h1, "b", b.pid);
    let c = Orphan::spawn(&["exit", "0"]);
    register(&h1, "c", c.pid);
    Fingerprint::of(c.pid).kill();
    h1.wait_ended("c");
    let now = status(&h1);
    assert_eq!(now["cluster"]["behind"], now["head_seq"], "{now}");
    // Said once, not at every retry (the retries log at debug, as the tests run it).
    let retried = eventually(MIRRORED, || {
        h1.log().matches("etcd still unreachable").count() >= 2
    });
    assert!(retried, "{}", h1.log());
    let warnings = h1.log().matches("etcd unreachable, retrying").count();
    assert_eq!(warnings, 1, "{}", h1.log());

    etcd.start();
    wait_caught_up(&h1);
    wait_keys(
        &etcd,
        "/liveness/sessions/",
        &["/liveness/sessions/h1/0/b".into()],
    );
    wait_keys(
        &etcd,
        "/liveness/ended/",
        &keys("/liveness/ended/h1/0/", &["a", "c"]),
    );
    assert_written_once(&etcd, "/liveness/ended/");

    // A hung etcd (it takes connections and answers nothing): a death is committed and
    // published here as fast as ever.
    etcd.signal(libc::SIGSTOP);
    let killed = Instant::now();
    Fingerprint::of(b.pid).kill();
    h1.wait_ended("b");
    let local = killed.elapsed();
    assert!(
        local < Duration::from_secs(1),
        "b ended here {local:?} after its death"
    );
    let d = Orphan::spawn(&["exit", "0"]);
    register(&h1, "d", d.pid);
    let noticed = eventually(MIRRORED, || cluster(&h1)["connected"] == false);
    assert!(noticed, "{}", cluster(&h1));
    assert!(cluster(&h1)["behind"].as_u64().unwrap() > 0);
    etcd.signal(libc::SIGCONT);
    wait_keys(
        &etcd,
        "/liveness/sessions/",
        &["/liveness/sessions/h1/0/d".into()],
    );
    wait_keys(
        &etcd,
        "/liveness/ended/",
        &keys("/liveness/ended/h1/0/", &["a", "b", "c"]),
    );

    // etcd killed and started again on its data.
    etcd.stop();
    let reply = h1.request(json!({"op": "end", "session": "d"}));
    assert_eq!(reply["ok"], true, "{reply}");
    etcd.start();
    wait_keys(&etcd, "/liveness/sessions/", &[]);
    wait_keys(
        &etcd,
        "/liveness/ended/",
        &keys("/liveness/ended/h1/0/", &["a", "b", "c", "d"]),
    );
    assert_written_once(&etcd, "/liveness/ended/");
    wait_caught_up(&h1);
    let cursor = &etcd.get_prefix("/liveness/cursors/h1")[0].1;
    assert_eq!(cursor["seq"], status(&h1)["head_seq"], "{cursor}");

    // A restarted daemon (a new run of the same database) resumes from the cursor.
    h1.stop();
    h1.restart();
    wait_caught_up(&h1);
    wait_keys(
        &etcd,
        "/liveness/ended/",
        &keys("/liveness/ended/h1/0/", &["a", "b", "c", "d"]),
    );
    assert_written_once(&etcd, "/liveness/ended/");
}

#[test]
fn a_users_session_ids_stay_under_their_host_and_uid() {
    let etcd = Etcd::started();
    let daemon = host(&etcd, "h1", "10s");
    open_socket_to_everyone(&daemon);
    let mallory = process_of(MALLORY);
    let mut client = ClientAs::connect(&daemon, MALLORY);
    let id = "../../../hosts/h2";
    let reply = client
        .request(&json!({"op": "register", "session": id, "owner": {"pid": mallory.id()}}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    // etcd's keys are flat: the id is the rest of a key under Mallory's uid, nothing more.
    let key = format!("/liveness/sessions/h1/{MALLORY}/{id}");
    wait_keys(&etcd, "/liveness/sessions/", &[key]);
    assert_eq!(etcd.keys("/liveness/hosts/"), ["/liveness/hosts/h1"]);
}

#[test]
fn a_host_id_or_prefix_that_is_no_clean_key_segment_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        ["--host-id", "../h2"],
        ["--host-id", "h1\u{1b}[2J"],
        ["--etcd-prefix", "/liveness/"],
        ["--etcd-ttl", "500ms"],
    ] {
        let output = Command::new(binary("livenessd"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--socket")
            .arg(dir.path().join("s.sock"))
            .args(["--etcd", "http://127.0.0.1:9"])
            .args(bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains(bad[0]), "{bad:?}: {stderr}");
        assert!(
            !dir.path().join("state").exists(),
            "{bad:?} created the state"
        );
    }
}

#[test]
fn one_host_id_is_one_daemons_and_a_restart_takes_its_own_back() {
    let etcd = Etcd::started();
    let mut first = host(&etcd, "twin", "10s");
    wait_caught_up(&first);
    let owner = Orphan::spawn(&["exit", "0"]);
    register(&first, "mine", owner.pid);
    let key = "/liveness/sessions/twin/0/mine".to_owned();
    wait_keys(&etcd, "/liveness/sessions/", std::slice::from_ref(&key));

    // A second daemon given the same host id would delete the first's sessions as stale:
    // it stays disconnected, says why, and writes nothing.
    let second = host(&etcd, "twin", "10s");
    let refused = eventually(MIRRORED, || {
        let cluster = cluster(&second);
        cluster["error"]
            .as_str()
            .is_some_and(|error| error.contains("another daemon"))
    });
    assert!(refused, "{}", cluster(&second));
    assert_eq!(cluster(&second)["connected"], false);
    assert_eq!(etcd.keys("/liveness/sessions/"), std::slice::from_ref(&key));
    let record = &etcd.get_prefix("/liveness/hosts/twin")[0].1;
    assert_eq!(record["store_id"], status(&first)["store_id"], "{record}");
    drop(second);

    // The first, SIGKILLed and started again on its state, takes its host back at once
    // rather than after the 10 s its old lease has left.
    first.kill9();
    let restarted = Instant::now();
    first.restart();
    wait_caught_up(&first);
    assert!(
        restarted.elapsed() < Duration::from_secs(8),
        "back online after {:?}",
        restarted.elapsed()
    );
    let record = &etcd.get_prefix("/liveness/hosts/twin")[0].1;
    assert_eq!(record["store_id"], status(&first)["store_id"], "{record}");
    assert_eq!(etcd.keys("/liveness/sessions/"), [key]);
}

#[test]
fn a_daemon_authenticates_with_a_password_only_it_can_read() {
    let mut etcd = Etcd::started();
    etcd.enable_auth("s3cret");
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("etcd-password");
    std::fs::write(&password, "s3cret\n").unwrap();
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Without a user, etcd refuses the mirror; the daemon serves and says why.
    let anonymous = host(&etcd, "anon", "5s");
    let refused = eventually(MIRRORED, || cluster(&anonymous)["error"].is_string());
    assert!(refused, "{}", cluster(&anonymous));
    assert_eq!(cluster(&anonymous)["connected"], false);

    let path = password.to_str().unwrap();
    let user = ["--etcd-user", "root", "--etcd-password-file", path];
    let url = etcd.url();
    let args = [&["--etcd", &url, "--host-id", "h1"][..], &user].concat();
    let daemon = Daemon::start(&args);
    wait_caught_up(&daemon);
    assert_eq!(etcd.keys("/liveness/hosts/"), ["/liveness/hosts/h1"]);
    assert!(
        !daemon.log().contains("s3cret"),
        "the password is in the log"
    );
    drop(daemon);

    // A password file that others may read, that another user owns, or a link planted in
    // its place is refused at start, with nothing created.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&password, &link).unwrap();
    let others = dir.path().join("others");
    std::fs::write(&others, "s3cret\n").unwrap();
    std::fs::set_permissions(&others, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&others, Some(MALLORY), Some(MALLORY)).unwrap();
    let readable = dir.path().join("readable");
    std::fs::write(&readable, "s3cret\n").unwrap();
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o640)).unwrap();
    for (file, says) in [
        (&link, "symbolic link"),
        (&others, "owned by uid 61061"),
        (&readable, "mode 640"),
    ] {
        let state = dir.path().join("state");
        let output = Command::new(binary("livenessd"))
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(dir.path().join("s.sock"))
            .args(["--etcd", &etcd.url(), "--host-id", "h2"])
            .args(["--etcd-user", "root", "--etcd-password-file"])
            .arg(file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{file:?}: {stderr}");
        assert!(stderr.contains(says), "{file:?}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{stderr}");
        assert!(!state.exists(), "{file:?}: the state was created");
    }
}

/// `livenessd` with `args` that it must refuse at start: its stderr, once it checked that
/// it created nothing.
fn refused_at_start(dir: &std::path::Path, args: &[&std::ffi::OsStr]) -> String {
    let state = dir.join("refused-state");
    let output = Command::new(binary("livenessd"))
        .arg("--state-dir")
        .arg(&state)
        .arg("--socket")
        .arg(dir.join("refused.sock"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!state.exists(), "{args:?}: the state was created");
    stderr
}

#[test]
fn a_daemon_speaks_tls_to_an_etcd_that_wants_client_certificates() {
    let etcd = Etcd::started_with_tls();
    let tls = etcd.tls().clone();
    let url = etcd.url();
    let flags = |cert: bool| {
        let mut args: Vec<std::ffi::OsString> = ["--etcd", &url, "--etcd-ttl", "5s"]
            .map(Into::into)
            .to_vec();
        args.extend(["--etcd-cacert".into(), tls.ca.clone().into()]);
        if cert {
            args.extend(["--etcd-cert".into(), tls.client_cert.clone().into()]);
            args.extend(["--etcd-key".into(), tls.client_key.clone().into()]);
        }
        args
    };
    let start = |host_id: &str, cert: bool| {
        let mut args = flags(cert);
        args.extend(["--host-id".into(), host_id.into()]);
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        Daemon::start(&args)
    };

    let daemon = start("h1", true);
    wait_caught_up(&daemon);
    let owner = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "s", owner.pid);
    wait_keys(
        &etcd,
        "/liveness/sessions/",
        &["/liveness/sessions/h1/0/s".into()],
    );
    assert_eq!(fleet_json(&daemon, &[])["hosts"][0]["host_id"], "h1");
    assert!(
        !daemon.log().contains("PRIVATE KEY"),
        "the key is in the log"
    );

    // Without a client certificate etcd refuses it: the daemon serves, and says why.
    let anonymous = start("h2", false);
    let refused = eventually(MIRRORED, || cluster(&anonymous)["error"].is_string());
    assert!(refused, "{}", cluster(&anonymous));
    assert_eq!(cluster(&anonymous)["connected"], false);
    assert_eq!(etcd.keys("/liveness/hosts/"), ["/liveness/hosts/h1"]);

    // What cannot work is refused at start, naming the flag and the file.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let readable_key = dir.path().join("readable.key");
    std::fs::copy(&tls.client_key, &readable_key).unwrap();
    std::fs::set_permissions(&readable_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let plain = url.replace("https://", "http://");
    let with = |flag: &str, value: &std::path::Path| {
        let mut args = flags(true);
        let at = args.iter().position(|a| a == flag).unwrap();
        args[at + 1] = value.into();
        args
    };
    let cases: Vec<(Vec<std::ffi::OsString>, String)> = vec![
        (
            with("--etcd-cacert", &missing),
            format!("--etcd-cacert {}", missing.display()),
        ),
        (with("--etcd-cert", &not_pem), "--etcd-cert".into()),
        (with("--etcd-key", &readable_key), "mode 644".into()),
        (
            with("--etcd", std::path::Path::new(&plain)),
            "give https:// endpoints".into(),
        ),
        (
            ["--etcd", url.as_str()].map(Into::into).to_vec(),
            "needs --etcd-cacert".into(),
        ),
    ];
    for (args, says) in cases {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let stderr = refused_at_start(dir.path(), &args);
        assert!(stderr.contains(&says), "{args:?}: {stderr}");
        assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
    }
}

/// A fleet lock request on a fresh connection of `daemon`.
fn fleet_lock(daemon: &Daemon, op: &str, name: &str, session: &str, wait: bool) -> Value {
    let mut request = json!({"op": op, "name": name, "session": session, "cluster": true});
    if wait {
        request["wait"] = json!(true);
    }
    daemon.request(request)
}

/// The token of a granted fleet lock.
fn token(reply: &Value) -> u64 {
    assert_eq!(reply["ok"], true, "{reply}");
    reply["lock"]["token"].as_u64().expect("a token")
}

/// `lock_acquire` with `wait` on a thread of its own: the reply, and when it came.
fn wait_for_lock(
    daemon: &Daemon,
    name: &str,
    session: &str,
) -> std::thread::JoinHandle<(Value, Instant)> {
    let mut conn = daemon.connect();
    let request = json!({"op": "lock_acquire", "name": name, "session": session,
        "cluster": true, "wait": true});
    std::thread::spawn(move || (conn.request(request), Instant::now()))
}

/// Waits until `count` keys are in line for fleet lock `name`.
fn wait_in_line(etcd: &Etcd, name: &str, count: usize) {
    let prefix = format!("/liveness/locks/{name}/");
    let queued = eventually(MIRRORED, || etcd.keys(&prefix).len() == count);
    assert!(queued, "in line for {name}: {:?}", etcd.keys(&prefix));
}

/// The fleet locks' follower reads the host's events only while one of its sessions has a
/// lease: without fleet locks, a death wakes the mirror alone among the daemon's readers.
#[test]
fn the_fleet_locks_follower_subscribes_only_while_a_session_has_a_lease() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "10s");
    wait_caught_up(&h1);
    let subscribers = |count: u64| {
        let mut seen = 0;
        let reached = eventually(MIRRORED, || {
            seen = status(&h1)["subscribers"].as_u64().unwrap();
            seen == count
        });
        assert!(reached, "{seen} subscribers, not {count}");
    };
    subscribers(1);
    let holder = Orphan::spawn(&["exit", "0"]);
    register(&h1, "holder", holder.pid);
    token(&fleet_lock(&h1, "lock_acquire", "deploy", "holder", false));
    subscribers(2);
    let released = fleet_lock(&h1, "lock_release", "deploy", "holder", false);
    assert_eq!(released["ok"], true, "{released}");
    // The follower leaves at the next event it reads.
    let other = Orphan::spawn(&["exit", "0"]);
    register(&h1, "other", other.pid);
    subscribers(1);

    // A session's end still revokes its lease once the follower has come back.
    token(&fleet_lock(&h1, "lock_acquire", "deploy", "holder", false));
    subscribers(2);
    let owner = h1.session("holder")["owner"]["pid"].as_u64().unwrap() as u32;
    Fingerprint::of(owner).kill();
    wait_keys(&etcd, "/liveness/locks/deploy/", &[]);
    subscribers(1);
}

#[test]
fn a_fleet_lock_passes_to_another_host_within_milliseconds_of_its_owners_death() {
    let etcd = Etcd::started();
    let (h1, h2) = (host(&etcd, "h1", "10s"), host(&etcd, "h2", "10s"));
    // The holder is `lock run --cluster`'s command, as a user would start it.
    let mut run = Command::new(binary("liveness"))
        .args(["--socket", h1.socket.to_str().unwrap()])
        .args([
            "lock",
            "run",
            "deploy",
            "--cluster",
            "--session",
            "holder",
            "--",
        ])
        .args(["sh", "-c", "echo \"$LIVENESS_LOCK_TOKEN\"; exec sleep 600"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("liveness lock run");
    let mut first = String::new();
    BufReader::new(run.stdout.take().unwrap())
        .read_line(&mut first)
        .expect("the token CMD got");
    let held: u64 = first
        .trim()
        .parse()
        .expect("a token in LIVENESS_LOCK_TOKEN");
    let key = etcd.get_prefix("/liveness/locks/deploy/");
    assert_eq!(key.len(), 1, "{key:?}");
    assert_eq!(key[0].1["host_id"], "h1", "{key:?}");
    assert_eq!(key[0].1["session"], "holder", "{key:?}");

    let waiter = Orphan::spawn(&["exit", "0"]);
    register(&h2, "waiter", waiter.pid);
    let refused = fleet_lock(&h2, "lock_acquire", "deploy", "waiter", false);
    assert_eq!(refused["error"]["code"], "lock_held", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"holder\"")
            && message.contains("\"h1\"")
            && message.contains(&held.to_string()),
        "the refusal names the holder, its host and its token: {message}"
    );
    let waiting = wait_for_lock(&h2, "deploy", "waiter");
    wait_in_line(&etcd, "deploy", 2);

    let owner = h1.session("holder")["owner"]["pid"].as_u64().unwrap() as u32;
    let killed = Instant::now();
    Fingerprint::of(owner).kill();
    let (granted, at) = waiting.join().unwrap();
    let handover = at - killed;
    eprintln!("holder's owner SIGKILLed on h1 -> the waiter on h2 granted: {handover:?}");
    assert!(token(&granted) > held, "{granted}");
    assert_eq!(granted["lock"]["session"], "waiter");
    // A round trip or two after the end, not the lease's TTL.
    assert!(
        handover < Duration::from_secs(2),
        "handed over after {handover:?}"
    );
    assert!(!run.wait().unwrap().success(), "CMD was killed");
    let key = etcd.get_prefix("/liveness/locks/deploy/");
    assert_eq!(key.len(), 1, "{key:?}");
    assert_eq!(key[0].1["host_id"], "h2", "{key:?}");
}

#[test]
fn hosts_racing_for_a_fleet_lock_get_it_one_at_a_time_with_growing_tokens() {
    let etcd = Etcd::started();
    let hosts: Vec<Daemon> = ["h1", "h2", "h3"]
        .iter()
        .map(|id| host(&etcd, id, "10s"))
        .collect();
    let owners: Vec<Orphan> = hosts
        .iter()
        .map(|_| Orphan::spawn(&["exit", "0"]))
        .collect();
    for (daemon, owner) in hosts.iter().zip(&owners) {
        register(daemon, "s", owner.pid);
    }
    // All at once, none waiting: one wins.
    let start = std::sync::Arc::new(std::sync::Barrier::new(hosts.len()));
    let replies: Vec<Value> = std::thread::scope(|scope| {
        let racers: Vec<_> = hosts
            .iter()
            .map(|daemon| {
                let start = start.clone();
                let mut conn = daemon.connect();
                scope.spawn(move || {
                    start.wait();
                    conn.request(json!({"op": "lock_acquire", "name": "deploy",
                        "session": "s", "cluster": true}))
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let winners: Vec<usize> = (0..hosts.len())
        .filter(|&i| replies[i]["ok"] == true)
        .collect();
    assert_eq!(winners.len(), 1, "{replies:?}");
    for (i, reply) in replies.iter().enumerate() {
        if i != winners[0] {
            assert_eq!(reply["error"]["code"], "lock_held", "{reply}");
        }
    }
    wait_in_line(&etcd, "deploy", 1);

    // The others wait in line (the CLI's --wait --json); each release hands the lock on.
    let mut tokens = vec![token(&replies[winners[0]])];
    let mut holder = winners[0];
    let waiters: Vec<_> = (0..hosts.len())
        .filter(|&i| i != holder)
        .map(|i| {
            let daemon = &hosts[i];
            let mut cli = Command::new(binary("liveness"));
            cli.args(["--socket", daemon.socket.to_str().unwrap(), "--json"])
                .args(["lock", "acquire", "deploy", "--cluster", "--session", "s"])
                .args(["--wait", "--timeout", "60s"]);
            (
                i,
                std::thread::spawn(move || cli.output().expect("liveness lock acquire")),
            )
        })
        .collect();
    wait_in_line(&etcd, "deploy", 3);
    let mut waiters: Vec<_> = waiters.into_iter().map(Some).collect();
    for _ in 0..2 {
        let released =
            hosts[holder].cli(&["lock", "release", "deploy", "--cluster", "--session", "s"]);
        assert!(released.status.success(), "{released:?}");
        let next = loop {
            if let Some(i) = (0..waiters.len()).find(|&w| {
                waiters[w]
                    .as_ref()
                    .is_some_and(|(_, thread)| thread.is_finished())
            }) {
                break i;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let (i, thread) = waiters[next].take().unwrap();
        let output = thread.join().unwrap();
        assert!(output.status.success(), "{output:?}");
        let lock: Value = serde_json::from_slice(&output.stdout).expect("the JSON grant");
        tokens.push(lock["token"].as_u64().expect("a token"));
        assert!(
            waiters.iter().flatten().all(|(_, t)| !t.is_finished()),
            "one grant per release"
        );
        holder = i;
    }
    eprintln!("fleet lock tokens in the order granted: {tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn a_dead_daemons_fleet_locks_are_freed_by_their_ttl_and_not_before() {
    let etcd = Etcd::started();
    let mut h1 = host(&etcd, "h1", "3s");
    let h2 = host(&etcd, "h2", "10s");
    let holder = Orphan::spawn(&["exit", "0"]);
    register(&h1, "holder", holder.pid);
    token(&fleet_lock(&h1, "lock_acquire", "deploy", "holder", false));
    let waiter = Orphan::spawn(&["exit", "0"]);
    register(&h2, "waiter", waiter.pid);
    let waiting = wait_for_lock(&h2, "deploy", "waiter");
    wait_in_line(&etcd, "deploy", 2);

    // The holder lives on; its daemon does not, and nothing renews the lease.
    h1.kill9();
    let killed = Instant::now();
    let (granted, at) = waiting.join().unwrap();
    let freed = at - killed;
    eprintln!("holder's daemon SIGKILLed (TTL 3 s) -> the waiter granted: {freed:?}");
    token(&granted);
    // Renewed every third of the TTL: at least two thirds of it were left.
    assert!(freed >= Duration::from_secs(2), "freed after {freed:?}");
    assert!(freed < Duration::from_secs(8), "freed after {freed:?}");
}

#[test]
fn a_daemon_cut_off_from_etcd_claims_no_fleet_lock_once_its_lease_could_have_expired() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "3s");
    let holder = Orphan::spawn(&["exit", "0"]);
    register(&h1, "holder", holder.pid);
    token(&fleet_lock(&h1, "lock_acquire", "deploy", "holder", false));
    etcd.signal(libc::SIGSTOP);
    let hung = Instant::now();
    // Past the TTL from the last renewal etcd confirmed, whatever etcd did meanwhile.
    std::thread::sleep(Duration::from_millis(3500));
    let refused = fleet_lock(&h1, "lock_release", "deploy", "holder", false);
    let answered = hung.elapsed();
    etcd.signal(libc::SIGCONT);
    assert_eq!(refused["error"]["code"], "not_held", "{refused}");
    // Said by the daemon itself, not after waiting for etcd.
    assert!(
        answered < Duration::from_millis(3500 + 1000),
        "{answered:?}"
    );
}

/// A daemon without `--etcd` refused the request, naming the flag.
fn assert_needs_etcd(refused: &Value) {
    assert_eq!(refused["error"]["code"], "invalid_request", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("--etcd"), "{refused}");
}

/// The CLI failed against a daemon without `--etcd`, naming the flag.
fn assert_cli_needs_etcd(cli: &std::process::Output) {
    assert!(!cli.status.success(), "{cli:?}");
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert!(stderr.contains("--etcd"), "{stderr}");
}

#[test]
fn a_fleet_lock_on_a_daemon_without_etcd_is_refused_with_why() {
    let daemon = Daemon::start(&[]);
    let owner = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "s", owner.pid);
    for op in ["lock_acquire", "lock_release"] {
        let refused = fleet_lock(&daemon, op, "deploy", "s", false);
        assert_needs_etcd(&refused);
    }
    assert_cli_needs_etcd(&daemon.cli(&[
        "lock",
        "acquire",
        "deploy",
        "--cluster",
        "--session",
        "s",
    ]));
    // Nothing was taken on the host instead.
    assert_eq!(
        daemon.request(json!({"op": "lock_list"}))["locks"],
        json!([])
    );
}

/// Alice's and Mallory's session `s` on a daemon whose socket everyone may use: each
/// user's owner process and connection.
fn two_users(daemon: &Daemon, alice: u32) -> [(UserProcess, ClientAs); 2] {
    open_socket_to_everyone(daemon);
    [alice, MALLORY].map(|uid| {
        let (owner, mut client) = (process_of(uid), ClientAs::connect(daemon, uid));
        let reply = client
            .request(&json!({"op": "register", "session": "s", "owner": {"pid": owner.id()}}))
            .expect("a reply");
        assert_eq!(reply["ok"], true, "{reply}");
        (owner, client)
    })
}

#[test]
fn no_user_releases_anothers_fleet_lock_and_names_stay_under_locks() {
    const ALICE: u32 = 61_062;
    let etcd = Etcd::started();
    let daemon = host(&etcd, "h1", "10s");
    let [(_alice, mut as_alice), (_mallory, mut as_mallory)] = two_users(&daemon, ALICE);
    let acquire = json!({"op": "lock_acquire", "name": "deploy", "session": "s", "cluster": true});
    let held = as_alice.request(&acquire).expect("a reply");
    let held = token(&held);

    // Mallory's own session holds nothing; Alice's she may not name.
    let mut release =
        json!({"op": "lock_release", "name": "deploy", "session": "s", "cluster": true});
    let refused = as_mallory.request(&release).expect("a reply");
    assert_eq!(refused["error"]["code"], "not_held", "{refused}");
    release["uid"] = json!(ALICE);
    let refused = as_mallory.request(&release).expect("a reply");
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    let refused = as_mallory.request(&acquire).expect("a reply");
    assert_eq!(refused["error"]["code"], "lock_held", "{refused}");
    let key = etcd.get_prefix("/liveness/locks/deploy/");
    assert_eq!(key.len(), 1, "Alice's key alone: {key:?}");
    assert_eq!(key[0].1["uid"], ALICE, "{key:?}");

    // A name is one segment under locks/, whatever it holds: Mallory's `deploy/x` is not in
    // line for `deploy`, nor `../hosts/h1` anywhere but under locks/.
    for name in ["deploy/x", "../hosts/h1"] {
        let sneaky = json!({"op": "lock_acquire", "name": name, "session": "s", "cluster": true});
        token(&as_mallory.request(&sneaky).expect("a reply"));
    }
    let keys = etcd.keys("/liveness/locks/..%2Fhosts%2Fh1/");
    assert_eq!(keys.len(), 1, "{:?}", etcd.keys("/liveness/"));
    assert_eq!(etcd.keys("/liveness/hosts/"), ["/liveness/hosts/h1"]);

    release["uid"] = json!(null);
    let released = as_alice.request(&release).expect("a reply");
    assert_eq!(token(&released), held);
    assert!(etcd.keys("/liveness/locks/deploy/").is_empty());
    let again = as_alice.request(&acquire).expect("a reply");
    assert!(token(&again) > held, "{again}");
}

/// `liveness fleet --json` as a host's CLI prints it.
fn fleet_json(daemon: &Daemon, args: &[&str]) -> Value {
    let mut all = vec!["--json", "fleet"];
    all.extend_from_slice(args);
    let output = daemon.cli(&all);
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("fleet --json is one JSON document")
}

/// The host of that id in a view.
fn host_in<'v>(view: &'v Value, id: &str) -> &'v Value {
    view["hosts"]
        .as_array()
        .and_then(|hosts| hosts.iter().find(|h| h["host_id"] == id))
        .unwrap_or_else(|| panic!("no host {id} in {view}"))
}

fn session_ids(host: &Value) -> Vec<String> {
    let sessions = host["sessions"].as_array().expect("sessions");
    sessions
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_fleet_shows_each_host_online_or_offline_with_its_sessions_and_filters_by_label() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "10s");
    let mut h2 = host(&etcd, "h2", "3s");
    let h3 = host(&etcd, "h3", "10s");
    let owners: Vec<Orphan> = (0..3).map(|_| Orphan::spawn(&["exit", "0"])).collect();
    register(&h1, "a1", owners[0].pid);
    let web = json!({
        "op": "register", "session": "b1", "owner": {"pid": owners[1].pid},
        "labels": {"team": "web"}
    });
    assert_eq!(h2.request(web)["ok"], true);
    register(&h3, "c1", owners[2].pid);
    for daemon in [&h1, &h2, &h3] {
        wait_caught_up(daemon);
    }

    let view = fleet_json(&h1, &[]);
    assert!(view["revision"].as_i64().unwrap() > 0, "{view}");
    let ids: Vec<&str> = (view["hosts"].as_array().unwrap().iter())
        .map(|h| h["host_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["h1", "h2", "h3"], "{view}");
    for (id, session) in [("h1", "a1"), ("h2", "b1"), ("h3", "c1")] {
        let entry = host_in(&view, id);
        assert_eq!(entry["online"], true, "{entry}");
        assert!(entry["since_ms"].as_i64().is_some(), "{entry}");
        assert_eq!(session_ids(entry), [session], "{entry}");
    }
    assert_eq!(
        host_in(&view, "h2")["sessions"][0]["owner"]["pid"],
        owners[1].pid
    );

    // Every label given must match; hosts without a matching session are left out.
    let web = fleet_json(&h3, &["--label", "team=web"]);
    let ids: Vec<&str> = (web["hosts"].as_array().unwrap().iter())
        .map(|h| h["host_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["h2"], "{web}");
    let none = fleet_json(&h3, &["--label", "team=web", "--label", "tier=x"]);
    assert_eq!(none["hosts"], json!([]), "{none}");

    // A killed daemon's host goes offline within its TTL; its sessions stay as last known.
    h2.kill9();
    let killed = Instant::now();
    let mut seen = Value::Null;
    let offline = eventually(Duration::from_secs(3 + 3), || {
        seen = fleet_json(&h1, &[]);
        host_in(&seen, "h2")["online"] == false
    });
    assert!(
        offline,
        "h2 still online {:?} after its kill: {seen}",
        killed.elapsed()
    );
    let h2_seen = host_in(&seen, "h2");
    assert_eq!(session_ids(h2_seen), ["b1"], "{h2_seen}");
    let last_seen = h2_seen["since_ms"].as_i64().expect("when h2 was last seen");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(now - last_seen < 10_000, "last seen {last_seen}, now {now}");
    let text = h1.cli(&["fleet"]);
    let text = String::from_utf8_lossy(&text.stdout);
    let h2_row = text.lines().find(|l| l.starts_with("h2")).expect(&text);
    assert!(
        h2_row.contains("offline") && h2_row.contains("b1"),
        "{text}"
    );
    let h1_row = text.lines().find(|l| l.starts_with("h1")).expect(&text);
    assert!(h1_row.contains("online") && h1_row.contains("a1"), "{text}");
}

/// `liveness fleet watch --json` on a daemon, each line as it is read.
fn fleet_watch(daemon: &Daemon, args: &[&str]) -> (Child, Receiver<Value>) {
    let mut watch = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--json", "fleet", "watch"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run liveness fleet watch");
    let stdout = watch.stdout.take().expect("piped");
    let (sink, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let value = serde_json::from_str(&line).expect("a JSON line");
            if sink.send(value).is_err() {
                return;
            }
        }
    });
    (watch, lines)
}

/// The next change of `kind` for `session` among the lines.
fn next_change(lines: &Receiver<Value>, kind: &str, session: &str) -> Value {
    loop {
        let line = lines
            .recv_timeout(MIRRORED)
            .unwrap_or_else(|_| panic!("no {kind} change of {session} within {MIRRORED:?}"));
        if line["change"] == kind && line["session"]["id"] == session {
            return line;
        }
    }
}

#[test]
fn fleet_watch_sees_a_session_appear_and_end_and_resumes_after_a_revision() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "10s");
    let h2 = host(&etcd, "h2", "10s");
    wait_caught_up(&h2);
    let (mut watch, lines) = fleet_watch(&h1, &["--label", "team=infra"]);
    let view = lines.recv_timeout(MIRRORED).expect("the view first");
    assert_eq!(
        view["hosts"],
        json!([]),
        "no session has the label yet: {view}"
    );

    let owner = Orphan::spawn(&["exit", "0"]);
    register(&h2, "w1", owner.pid);
    let other = Orphan::spawn(&["exit", "0"]);
    let unlabelled = json!({"op": "register", "session": "w0", "owner": {"pid": other.pid}});
    assert_eq!(h2.request(unlabelled)["ok"], true);
    let appeared = next_change(&lines, "session", "w1");
    assert_eq!(appeared["host_id"], "h2", "{appeared}");
    assert_eq!(appeared["session"]["phase"], "active", "{appeared}");
    Fingerprint::of(owner.pid).kill();
    let ended = next_change(&lines, "ended", "w1");
    assert_eq!(ended["event"]["kind"], "session.ended", "{ended}");
    assert_eq!(ended["event"]["reason"], "owner_exited", "{ended}");
    assert!(ended["revision"].as_i64() > appeared["revision"].as_i64());
    let _ = watch.kill();
    let _ = watch.wait();

    // From the revision of its appearance on, a new watch sees its end again, and
    // the label filter left the unlabelled session out of both.
    let mut resumed = h1.connect();
    let since = appeared["revision"].as_i64().unwrap();
    let reply =
        resumed.request(json!({"op": "fleet_watch", "since": since, "labels": {"team": "infra"}}));
    assert_eq!(reply, json!({"ok": true}));
    let line = resumed.next_within(MIRRORED).expect("a change");
    assert_eq!(line["fleet_change"]["change"], "ended", "{line}");
    assert_eq!(line["fleet_change"]["session"]["id"], "w1", "{line}");

    // A revision etcd compacted away is refused, saying what to do.
    etcd.compact();
    let refused = h1.request(json!({"op": "fleet_watch", "since": 1}));
    assert_eq!(refused["error"]["code"], "invalid_request", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("without `since`")
    );
    // Nor is a revision that etcd never sent.
    for since in [-1, i64::MAX] {
        let refused = h1.request(json!({"op": "fleet_watch", "since": since}));
        assert_eq!(refused["error"]["code"], "invalid_request", "{refused}");
    }
}

#[test]
fn a_daemon_without_etcd_refuses_the_fleets_view_with_why() {
    let daemon = Daemon::start(&[]);
    for op in ["fleet", "fleet_watch"] {
        let refused = daemon.request(json!({"op": op}));
        assert_needs_etcd(&refused);
    }
    for args in [&["fleet"][..], &["fleet", "watch"]] {
        assert_cli_needs_etcd(&daemon.cli(args));
    }
    let bad = daemon.request(json!({"op": "fleet", "label": {"a": "b"}}));
    assert_eq!(bad["error"]["code"], "invalid_request", "{bad}");
}

#[test]
fn the_fleets_text_escapes_hostile_labels_and_users_see_no_others_evidence() {
    let etcd = Etcd::started();
    let h1 = host(&etcd, "h1", "10s");
    let h2 = host(&etcd, "h2", "10s");
    open_socket_to_everyone(&h1);
    let owner = Orphan::spawn(&["exit", "0"]);
    let hostile = json!({
        "op": "register", "session": "s1", "owner": {"pid": owner.pid},
        "labels": {"note": "x\u{1b}]52;c;cHdu\u{7}\u{1b}[2Jy\u{9b}31m"},
        "on_end_run": [{"argv": ["notify", "--token", "hunter2"]}]
    });
    assert_eq!(h2.request(hostile)["ok"], true);
    wait_caught_up(&h2);

    let text = h1.cli(&["fleet"]);
    assert!(text.status.success(), "{text:?}");
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{text:?}"
    );
    assert!(
        text.contains(r"x\u{1b}]52;c;cHdu\u{7}\u{1b}[2Jy\u{9b}31m"),
        "{text}"
    );
    let json = h1.cli(&["--json", "fleet"]);
    let json = String::from_utf8(json.stdout).unwrap();
    assert!(!json.trim_end().chars().any(char::is_control), "{json:?}");

    // Root sees the session whole; another user of h1 sees who, where and what, not the
    // commands of its end actions.
    let as_root = h1.request(json!({"op": "fleet"}));
    let session = &host_in(&as_root["fleet"], "h2")["sessions"][0];
    assert_eq!(session["on_end_run"][0]["argv"][2], "hunter2", "{session}");
    let mut as_mallory = ClientAs::connect(&h1, MALLORY);
    let seen = as_mallory
        .request(&json!({"op": "fleet"}))
        .expect("a reply");
    let session = &host_in(&seen["fleet"], "h2")["sessions"][0];
    assert_eq!(session["id"], "s1", "{seen}");
    assert!(session.get("on_end_run").is_none(), "{session}");
    assert!(!seen.to_string().contains("hunter2"), "{seen}");
}

/// The fleet locks in `lock_list` of a daemon, as root sees it.
fn fleet_locks_listed(daemon: &Daemon) -> Vec<Value> {
    let reply = daemon.request(json!({"op": "lock_list"}));
    assert_eq!(reply["ok"], true, "{reply}");
    let locks = reply["locks"].as_array().expect("locks");
    locks
        .iter()
        .filter(|lock| lock["cluster"] == true)
        .cloned()
        .collect()
}

/// The next `lock.*` event about `session` on a subscription, in a word each: its kind,
/// name, token, reason (`-`: none) and scope (`fleet` or `host`).
fn next_lock_event(stream: &mut Conn, session: &str) -> String {
    loop {
        let event = next_event(stream);
        let kind = event["kind"].as_str().unwrap_or_default();
        if kind.starts_with("lock.") && event["session"] == session {
            let lock = &event["lock"];
            let scope = if lock["cluster"] == true {
                "fleet"
            } else {
                "host"
            };
            return format!(
                "{kind} {} {} {} {scope}",
                lock["name"].as_str().unwrap_or_default(),
                lock["token"],
                lock["reason"].as_str().unwrap_or("-"),
            );
        }
    }
}

#[test]
fn a_fleet_lock_outlives_its_daemons_restart_while_its_lease_does() {
    let etcd = Etcd::started();
    let mut h1 = host(&etcd, "h1", "4s");
    let h2 = host(&etcd, "h2", "10s");
    let (holder, waiter) = (Orphan::spawn(&["exit", "0"]), Orphan::spawn(&["exit", "0"]));
    register(&h1, "holder", holder.pid);
    register(&h2, "waiter", waiter.pid);
    for (how, name) in [("SIGTERM", "deploy-term"), ("SIGKILL", "deploy-kill")] {
        let held = token(&fleet_lock(&h1, "lock_acquire", name, "holder", false));
        let waiting = wait_for_lock(&h2, name, "waiter");
        wait_in_line(&etcd, name, 2);
        let stopped = Instant::now();
        if how == "SIGTERM" {
            assert!(h1.stop().success());
        } else {
            h1.kill9();
        }
        h1.restart();
        wait_caught_up(&h1);
        // Past the TTL of the lease as last renewed before the stop: only the restarted
        // daemon's renewals keep it.
        std::thread::sleep(Duration::from_millis(5500).saturating_sub(stopped.elapsed()));
        assert!(
            !waiting.is_finished(),
            "{how}: the waiter on h2 was granted while the holder lives: {:?}",
            waiting.join()
        );
        let listed = fleet_locks_listed(&h1);
        assert_eq!(listed.len(), 1, "{how}: {listed:?}");
        assert_eq!(
            (&listed[0]["name"], &listed[0]["token"], &listed[0]["host"]),
            (&json!(name), &json!(held), &json!("h1")),
            "{how}: {listed:?}"
        );
        assert!(h1.log().contains("re-attached a lease"), "{how}");

        // The holder releases it as it would have without the restart: the waiter gets it.
        let released = fleet_lock(&h1, "lock_release", name, "holder", false);
        assert_eq!(token(&released), held, "{how}");
        let (granted, _) = waiting.join().unwrap();
        assert!(token(&granted) > held, "{how}: {granted}");
        token(&fleet_lock(&h2, "lock_release", name, "waiter", false));
        assert!(fleet_locks_listed(&h1).is_empty(), "{how}");
    }
}

#[test]
fn a_fleet_lock_whose_lease_ran_out_while_its_daemon_was_down_is_released_and_its_holder_told() {
    let etcd = Etcd::started();
    let mut h1 = host(&etcd, "h1", "2s");
    let h2 = host(&etcd, "h2", "10s");
    let (holder, waiter) = (Orphan::spawn(&["exit", "0"]), Orphan::spawn(&["exit", "0"]));
    register(&h1, "holder", holder.pid);
    register(&h2, "waiter", waiter.pid);
    let held = token(&fleet_lock(&h1, "lock_acquire", "deploy", "holder", false));
    let waiting = wait_for_lock(&h2, "deploy", "waiter");
    wait_in_line(&etcd, "deploy", 2);

    // Down for longer than the TTL: etcd gives the lock to the waiter.
    h1.kill9();
    let (granted, _) = waiting.join().unwrap();
    let granted = token(&granted);
    assert!(granted > held);
    h1.restart();
    wait_caught_up(&h1);

    // The restarted daemon tells the holder, and claims nothing: never two holders.
    let mut stream = subscribe(&h1, Some(0));
    let events = [(); 2].map(|()| next_lock_event(&mut stream, "holder"));
    assert_eq!(
        events,
        [
            format!("lock.acquired deploy {held} - fleet"),
            format!("lock.released deploy {held} lease_lost fleet"),
        ]
    );
    assert!(fleet_locks_listed(&h1).is_empty());
    let refused = fleet_lock(&h1, "lock_release", "deploy", "holder", false);
    assert_eq!(refused["error"]["code"], "not_held", "{refused}");
    let line = etcd.get_prefix("/liveness/locks/deploy/");
    assert_eq!(line.len(), 1, "{line:?}");
    assert_eq!(line[0].1["host_id"], "h2", "{line:?}");
    assert_eq!(h1.session("holder")["phase"], "active");
}

#[test]
fn fleet_locks_show_in_lock_list_and_the_event_stream_as_host_locks_do() {
    const ALICE: u32 = 61_063;
    let etcd = Etcd::started();
    let daemon = host(&etcd, "h1", "10s");
    let [(alice, mut as_alice), (_mallory, mut as_mallory)] = two_users(&daemon, ALICE);
    let mut stream = subscribe(&daemon, None);
    let acquire = json!({"op": "lock_acquire", "name": "deploy", "session": "s", "cluster": true});
    let granted = as_alice.request(&acquire).expect("a reply");
    let held = token(&granted);
    assert_eq!(
        (&granted["lock"]["cluster"], &granted["lock"]["host"]),
        (&json!(true), &json!("h1")),
        "{granted}"
    );
    let host_lock = json!({"op": "lock_acquire", "name": "deploy", "session": "s"});
    token(&as_alice.request(&host_lock).expect("a reply"));
    // Another user's: a name a terminal would obey is refused, one that looks like a path
    // is only a name.
    let escape = json!({"op": "lock_acquire", "name": "\u{1b}]0;pwned\u{7}x", "session": "s",
        "cluster": true});
    let refused = as_mallory.request(&escape).expect("a reply");
    assert_eq!(refused["error"]["code"], "invalid_request", "{refused}");
    let hostile = "../deploy";
    let sneaky = json!({"op": "lock_acquire", "name": hostile, "session": "s", "cluster": true});
    token(&as_mallory.request(&sneaky).expect("a reply"));

    // Each user lists its own, the host lock and the fleet lock of one name apart.
    let listed = as_alice
        .request(&json!({"op": "lock_list"}))
        .expect("a reply");
    let locks = listed["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 2, "{listed}");
    assert_eq!(locks[0]["cluster"], Value::Null, "the host lock: {listed}");
    assert_eq!(
        (&locks[1]["cluster"], &locks[1]["host"], &locks[1]["token"]),
        (&json!(true), &json!("h1"), &json!(held)),
        "{listed}"
    );
    let theirs = as_mallory
        .request(&json!({"op": "lock_list"}))
        .expect("a reply");
    let theirs = theirs["locks"].as_array().expect("locks");
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(theirs[0]["name"], hostile, "Mallory's only: {theirs:?}");
    // Paged one at a time, nothing is skipped or repeated.
    let mut names = Vec::new();
    let mut after = Value::Null;
    loop {
        let mut page = json!({"op": "lock_list", "limit": 1});
        if !after.is_null() {
            page["after"] = after.clone();
        }
        let reply = daemon.request(page);
        for lock in reply["locks"].as_array().expect("locks") {
            names.push((lock["name"].clone(), lock["cluster"].clone()));
        }
        after = reply["next"].clone();
        if after.is_null() {
            break;
        }
    }
    assert_eq!(names.len(), 3, "{names:?}");
    let text = daemon.cli(&["lock", "list"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("fleet, held on h1"), "{text}");

    let release = json!({"op": "lock_release", "name": "deploy", "session": "s", "cluster": true});
    assert_eq!(token(&as_alice.request(&release).expect("a reply")), held);
    let again = token(&as_alice.request(&acquire).expect("a reply"));
    drop(alice);
    // Alice's `deploy` events (Mallory's lock has another name), until the fleet lock's
    // release with the session's end.
    let mut events: Vec<String> = Vec::new();
    while !events
        .last()
        .is_some_and(|last| last.ends_with("session_ended fleet"))
    {
        let event = next_lock_event(&mut stream, "s");
        if event.starts_with("lock.acquired deploy ") || event.starts_with("lock.released deploy ")
        {
            events.push(event);
        }
    }
    let host_token = events[1].split(' ').nth(2).unwrap_or_default().to_owned();
    assert_eq!(
        events,
        [
            format!("lock.acquired deploy {held} - fleet"),
            format!("lock.acquired deploy {host_token} - host"),
            format!("lock.released deploy {held} released fleet"),
            format!("lock.acquired deploy {again} - fleet"),
            // The host lock with the end, in its transaction; the fleet lock once the daemon
            // read the end and revoked the session's lease.
            format!("lock.released deploy {host_token} session_ended host"),
            format!("lock.released deploy {again} session_ended fleet"),
        ]
    );
    assert!(etcd.keys("/liveness/locks/deploy/").is_empty());
}
