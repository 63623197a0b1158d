//! `livenessd`'s flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::activity::ActivityConfig;
use crate::source::ebpf::EbpfConfig;
use crate::source::monitor::Selection;
use liveness_common::activity::StallPolicy;
use liveness_common::request::CgroupLimits;
use liveness_common::status::LimitsConfig;

/// The liveness daemon: learns from the kernel when session owners die and finalizes
/// their sessions.
///
/// With no flags it runs on its embedded defaults: as root, state in /var/lib/liveness and
/// the socket /run/liveness/liveness.sock; as another user, $XDG_STATE_HOME/liveness and
/// $XDG_RUNTIME_DIR/liveness.sock. It stays in the foreground and logs to stderr (or
/// --log-file); SIGTERM/SIGINT stop it cleanly, SIGHUP reopens the log file. Should any
/// part of it fail while running, it exits non-zero so that a supervisor restarts it.
#[derive(Debug, Parser)]
#[command(name = "livenessd", version)]
pub struct Args {
    /// Socket to listen on [env: LIVENESS_SOCKET].
    #[arg(long, value_name = "PATH")]
    pub(super) socket: Option<PathBuf>,
    /// Directory for the database [env: LIVENESS_STATE_DIR].
    #[arg(long, value_name = "DIR")]
    pub(super) state_dir: Option<PathBuf>,
    /// Exit sources: auto, or a comma-separated list of ebpf, pidfd, procpoll.
    #[arg(long, default_value = "auto", value_name = "LIST")]
    pub(super) sources: Selection,
    /// How often the /proc poller re-checks the processes it covers.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) procpoll_interval: Duration,
    /// Sessions whose owner cannot be watched (another host) end after this long without activity.
    #[arg(long, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) unknown_timeout: Duration,
    /// Pending sessions that are never renamed end after this long.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) pending_ttl: Duration,
    /// Keep at most this many events for replay.
    #[arg(long, default_value_t = 100_000, value_name = "COUNT")]
    pub(super) retain_events: u64,
    /// Keep events for replay, and ended sessions for `get`, at most this long. An ended
    /// session's id is refused while it is kept and free again once it is deleted.
    #[arg(long, default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) retain_age: Duration,
    /// Commits (batches of events) queued per subscriber before it is disconnected as lagging.
    #[arg(long, default_value_t = 4096, value_name = "COUNT")]
    pub(super) subscriber_queue: usize,
    /// How long a death seen only by a pidfd waits for its parent's reap, which gives the
    /// exit status on Linux 6.15+; past it the session ends without a status.
    #[arg(long, default_value = "50ms", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) exit_status_wait: Duration,
    /// Put on each `session.ended` event the monotonic time of every hop its death took
    /// through the daemon (`hops`), for benchmarks.
    #[arg(long)]
    pub(super) trace_hops: bool,
    /// Most processes the eBPF filter map holds.
    #[arg(long, default_value_t = EbpfConfig::default().max_tracked, value_name = "COUNT")]
    pub(super) ebpf_max_tracked: u32,
    /// Size of the eBPF ring buffer (a power of two, at least 4096). Deaths that find it
    /// full are counted, and every tracked process is then re-checked.
    #[arg(long, default_value_t = EbpfConfig::default().ring_bytes, value_parser = parse_ring_bytes, value_name = "BYTES")]
    pub(super) ebpf_ring_bytes: u32,
    /// Most session process-tree members the eBPF members map holds (it has room for one
    /// more entry per tracked process besides, so members never take a tracked process's
    /// room). New processes that find no room are counted, and members are then found by
    /// scanning /proc as well.
    #[arg(long, default_value_t = EbpfConfig::default().max_members, value_name = "COUNT")]
    pub(super) ebpf_max_members: u32,
    /// How many of the members' entries the processes forked by one uid other than root may
    /// hold (default: a quarter of --ebpf-max-members): one user's storm of forks leaves
    /// the rest to root's and the other users' trees. Uids equal modulo 4096 share one.
    #[arg(long, value_name = "COUNT")]
    pub(super) ebpf_max_members_per_uid: Option<u32>,
    /// Pin the eBPF lineage programs and their map under DIR, a bpffs directory such as
    /// /sys/fs/bpf/liveness, in a subdirectory of this state directory's own: they then
    /// outlive the daemon, and a restarted daemon adopts them, so that processes orphaned
    /// while no daemon ran are placed in their trees. bpffs is mounted on /sys/fs/bpf if
    /// nothing is. When pinning fails the daemon runs unpinned and `status` says why.
    /// At start the pins under DIR of state directories that no longer exist are removed.
    /// Without this flag the programs go with the daemon.
    #[arg(long, value_name = "DIR")]
    pub(super) ebpf_pin_dir: Option<PathBuf>,
    /// Remove the lineage programs pinned for this state directory under --ebpf-pin-dir, so
    /// that they stop, then exit (refused while a daemon runs on the state directory).
    #[arg(long, requires = "ebpf_pin_dir")]
    pub(super) unpin: bool,
    /// How often each live session's tree is sampled for its activity (a session waiting
    /// for its user: four times less often). See docs/activity.md.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) activity_interval: Duration,
    /// A session with a turn in flight and no progress for this long is `stalled`
    /// (`session.stalled`).
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) stall_after: Duration,
    /// A tree that burns at least 80 % of a core with no I/O and no new process for this
    /// long is `spinning` (`session.stalled`).
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) spin_after: Duration,
    /// A declared tool in flight is never a stall before this long.
    #[arg(long, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) tool_stall_after: Duration,
    /// What a stall does besides its event, for sessions registered without their own
    /// (`register --on-stall`): `notify` (the event only), `run:CMD` (as the session's
    /// creator, the judgement on stdin), `signal:SIG` (to the owner) or `terminate` (its
    /// tree). See docs/activity.md.
    #[arg(long, default_value = "notify", value_parser = parse_on_stall, value_name = "ACTION")]
    pub(super) on_stall: StallPolicy,
    /// Give every new session a cgroup of its own (docs/cgroups.md) unless it asks for its
    /// own limits or for none (`register --no-cgroup`): alone, without limits; or with
    /// `memory-max=SIZE,memory-high=SIZE,tasks-max=N,cpu-weight=N,on-oom=continue|end`.
    /// On a host without usable cgroup2 each registration warns that it has none.
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_parser = CgroupLimits::parse, value_name = "LIMITS")]
    pub(super) session_cgroup: Option<CgroupLimits>,
    /// A process name that `owner: "auto"` skips as a wrapper (repeatable).
    #[arg(long = "wrapper", value_name = "COMM")]
    pub(super) wrappers: Vec<String>,
    /// Log to this file instead of stderr; SIGHUP reopens it (for log rotation).
    #[arg(long, value_name = "PATH")]
    pub(super) log_file: Option<PathBuf>,
    /// Set a damaged database aside (renamed with a timestamp), start a new one from what
    /// can still be read, then run as usual (reconciling every session read).
    #[arg(long)]
    pub(super) recover: bool,
    /// Open connections of one non-root uid.
    #[arg(long, default_value_t = LimitsConfig::default().connections_per_uid, value_parser = parse_count::<usize>, value_name = "COUNT")]
    pub(super) max_connections_per_uid: usize,
    /// Open connections of all non-root uids together (root's are never refused).
    #[arg(long, default_value_t = LimitsConfig::default().connections, value_parser = parse_count::<usize>, value_name = "COUNT")]
    pub(super) max_connections: usize,
    /// Requests of one non-root uid handled at once; more wait their turn.
    #[arg(long, default_value_t = LimitsConfig::default().requests_per_uid, value_parser = parse_count::<usize>, value_name = "COUNT")]
    pub(super) max_requests_per_uid: usize,
    /// A client that begins a request line and does not end it within this long is
    /// disconnected.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) line_timeout: Duration,
    /// ACTIVE sessions of one non-root uid.
    #[arg(long, default_value_t = LimitsConfig::default().sessions_per_uid, value_parser = parse_count::<u64>, value_name = "COUNT")]
    pub(super) max_sessions_per_uid: u64,
    /// Bytes of label keys and values of one session.
    #[arg(long, default_value_t = LimitsConfig::default().label_bytes, value_parser = parse_count::<u64>, value_name = "BYTES")]
    pub(super) max_label_bytes: u64,
    /// Bytes of label keys and values, and of held lock names, of one non-root uid's
    /// ACTIVE sessions.
    #[arg(long, default_value_t = LimitsConfig::default().label_bytes_per_uid, value_parser = parse_count::<u64>, value_name = "BYTES")]
    pub(super) max_label_bytes_per_uid: u64,
    /// Locks held by one non-root uid's sessions.
    #[arg(long, default_value_t = LimitsConfig::default().locks_per_uid, value_parser = parse_count::<u64>, value_name = "COUNT")]
    pub(super) max_locks_per_uid: u64,
    /// End actions of one non-root uid without an outcome: those of its active sessions,
    /// and those waiting or running after their sessions ended. A registration that would
    /// pass it is refused.
    #[arg(long, default_value_t = LimitsConfig::default().actions_per_uid, value_parser = parse_count::<u64>, value_name = "COUNT")]
    pub(super) max_actions_per_uid: u64,
    /// End actions of one user running at once; the others wait their turn.
    #[arg(long, default_value_t = crate::action::runner::DEFAULT_ACTIONS_PER_UID, value_parser = parse_count::<usize>, value_name = "COUNT")]
    pub(super) action_slots: usize,
    /// Between SIGTERM and SIGKILL when an end action's process tree is ended (at its
    /// timeout, or when the daemon stops during it).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(super) action_grace: std::time::Duration,
    /// Serve the status counters in the Prometheus format at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9464). Off by default; there is no authentication, so keep ADDR local.
    #[arg(long, value_name = "ADDR")]
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    /// Mirror this host's sessions into etcd at these endpoints (comma-separated URLs,
    /// such as http://10.0.0.5:2379): presence, ACTIVE sessions and recent ends
    /// (docs/fleet.md). Off by default. Deaths never wait on etcd.
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL...]")]
    pub(super) etcd: Vec<String>,
    /// The key prefix of the fleet in etcd.
    #[arg(long, default_value = "/liveness", value_parser = crate::fleet::parse_prefix, value_name = "PREFIX")]
    pub(super) etcd_prefix: String,
    /// This host's name in the fleet (default: the machine id, /etc/machine-id).
    #[arg(long, value_parser = crate::fleet::parse_host_id, value_name = "NAME")]
    pub(super) host_id: Option<String>,
    /// The TTL of the host's lease: a host whose daemon or machine stops is offline after it.
    #[arg(long, default_value = "10s", value_parser = crate::fleet::parse_ttl, value_name = "DURATION")]
    pub(super) etcd_ttl: Duration,
    /// The etcd user the daemon authenticates as (with --etcd-password-file).
    #[arg(long, requires = "etcd_password_file", value_name = "NAME")]
    pub(super) etcd_user: Option<String>,
    /// A file whose first line is the etcd user's password: owned by the daemon's user or
    /// root, readable by nobody else.
    #[arg(long, requires = "etcd_user", value_name = "PATH")]
    pub(super) etcd_password_file: Option<PathBuf>,
    /// The CA certificate (PEM) that etcd's certificate is signed by: TLS to https://
    /// endpoints.
    #[arg(long, value_name = "PATH")]
    pub(super) etcd_cacert: Option<PathBuf>,
    /// This daemon's client certificate (PEM), for an etcd with --client-cert-auth.
    #[arg(long, requires_all = ["etcd_key", "etcd_cacert"], value_name = "PATH")]
    pub(super) etcd_cert: Option<PathBuf>,
    /// The key of --etcd-cert (PEM): owned by the daemon's user or root, readable by
    /// nobody else.
    #[arg(long, requires = "etcd_cert", value_name = "PATH")]
    pub(super) etcd_key: Option<PathBuf>,
    /// How long the record of a session's end stays in etcd (at least this, at most a
    /// 24th more).
    #[arg(long, default_value = "1d", value_parser = crate::fleet::parse_ttl, value_name = "DURATION")]
    pub(super) etcd_ended_retention: Duration,
    /// Write the man page livenessd.8, generated from these flags, into DIR and exit (for
    /// packaging: `cargo xtask dist`).
    #[arg(long, value_name = "DIR", hide = true)]
    pub(super) generate_man: Option<PathBuf>,
}

impl Args {
    pub(super) fn activity(&self) -> ActivityConfig {
        ActivityConfig {
            interval: self.activity_interval,
            stall_after: self.stall_after,
            spin_after: self.spin_after,
            tool_stall_after: self.tool_stall_after,
            on_stall: self.on_stall.clone(),
        }
    }

    pub(super) fn limits(&self) -> LimitsConfig {
        LimitsConfig {
            connections_per_uid: self.max_connections_per_uid,
            connections: self.max_connections,
            requests_per_uid: self.max_requests_per_uid,
            line_timeout: self.line_timeout,
            sessions_per_uid: self.max_sessions_per_uid,
            label_bytes: self.max_label_bytes,
            label_bytes_per_uid: self.max_label_bytes_per_uid,
            locks_per_uid: self.max_locks_per_uid,
            actions_per_uid: self.max_actions_per_uid,
        }
    }
}

/// `--on-stall`: a daemon-wide command runs in its user's home directory (a session's own,
/// where it registered).
fn parse_on_stall(text: &str) -> Result<StallPolicy, String> {
    StallPolicy::parse_action(text, None)
}

/// A limit: a positive whole number.
fn parse_count<T: std::str::FromStr + Default + PartialEq>(text: &str) -> Result<T, String> {
    match text.parse::<T>() {
        Ok(count) if count != T::default() => Ok(count),
        Ok(_) => Err("0 would refuse everything; give a positive number".into()),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

fn parse_ring_bytes(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(bytes) if bytes >= 4096 && bytes.is_power_of_two() => Ok(bytes),
        _ => Err(format!("{text:?} is not a power of two of at least 4096")),
    }
}

use liveness_common::duration::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::pidfd::DEFAULT_STATUS_WAIT;

    #[test]
    fn ring_sizes_are_powers_of_two_of_a_page_or_more() {
        assert_eq!(parse_ring_bytes("4096"), Ok(4096));
        assert_eq!(parse_ring_bytes("2097152"), Ok(2 * 1024 * 1024));
        for bad in ["4095", "6144", "2048", "0", "big"] {
            assert!(parse_ring_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_status_wait_flag_defaults_to_the_librarys() {
        assert_eq!(
            Args::parse_from(["livenessd"]).exit_status_wait,
            DEFAULT_STATUS_WAIT,
            "the flag's default is the library's"
        );
    }

    #[test]
    fn zero_durations_and_limits_are_refused() {
        let refused = Args::try_parse_from(["livenessd", "--procpoll-interval", "0ms"])
            .expect_err("a zero poll interval");
        assert!(refused.to_string().contains("zero"), "{refused}");
        assert!(Args::try_parse_from(["livenessd", "--max-connections-per-uid", "0"]).is_err());
    }
}
