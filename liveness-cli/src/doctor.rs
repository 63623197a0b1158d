//! `liveness doctor`: the daemon's account of its exit sources, and apart from it what this
//! process could start.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use liveness_client::Client;
use liveness_common::status::{
    CgroupStatus, MembershipStatus, SourceName, SourceReport, SourceState, Status,
};
use liveness_proc::diagnose::{self, Restrictions};

use crate::args::DoctorArgs;
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::pids::Numbering;
use crate::render::{print_cgroup, print_membership, print_sources};

impl DoctorArgs {
    /// The daemon's own account of its sources, and apart from it what this process could
    /// start (a daemon without CAP_BPF must not look able to run eBPF because the client has
    /// it).
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let json = context.json;
        let mut pids = Numbering::Same;
        let answer = Client::connect(&context.socket).and_then(|mut client| {
            pids = Numbering::of(&client);
            client.status()
        });
        let (daemon, daemon_error) = match answer {
            Ok(status) => (Some(DaemonDoctor::of(status)), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let restrictions = Restrictions::of_this_thread();
        let client = ClientDoctor {
            pid: std::process::id(),
            euid: rustix::process::geteuid().as_raw(),
            kernel: rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned(),
            sources: client_sources(),
            restrictions,
        };
        let daemon_active = daemon.as_ref().is_some_and(|d| {
            d.sources
                .iter()
                .any(|s| matches!(s.state, SourceState::Active | SourceState::Degraded))
        });
        if json {
            output::json(&Doctor {
                daemon,
                daemon_error,
                client,
            });
        } else {
            match (&daemon, &daemon_error) {
                (Some(daemon), _) => {
                    outln!(
                        "daemon: livenessd {}, {}, sources {}",
                        daemon.version,
                        pids.daemon(daemon.pid),
                        daemon.selection
                    );
                    print_sources(&daemon.sources);
                    if let Some(membership) = &daemon.membership {
                        print_membership(membership);
                    }
                    if let Some(cgroup) = &daemon.cgroup {
                        print_cgroup(cgroup);
                    }
                }
                (None, error) => outln!(
                    "daemon: not reachable: {}",
                    error.as_deref().unwrap_or("no answer")
                ),
            }
            let restrictions = &client.restrictions;
            let capabilities = if restrictions.capabilities.is_empty() {
                "none".to_owned()
            } else {
                restrictions.capabilities.join(" ")
            };
            outln!(
                "this client (pid {}, euid {}, kernel {}, seccomp mode {}, capabilities {capabilities}) could start:",
                client.pid,
                client.euid,
                client.kernel,
                restrictions.seccomp_mode
            );
            print_sources(&client.sources);
        }
        Ok(if daemon_active {
            Exit::Ok
        } else {
            Exit::Unavailable
        }
        .into())
    }
}

/// `liveness doctor --json`.
#[derive(Debug, Serialize)]
pub(crate) struct Doctor {
    /// The daemon's own account of its sources; `null` when it cannot be reached.
    daemon: Option<DaemonDoctor>,
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_error: Option<String>,
    /// What this process could start.
    client: ClientDoctor,
}

/// The daemon part of `doctor`: who answered and its sources, as its status has them.
#[derive(Debug, Serialize)]
struct DaemonDoctor {
    pid: u32,
    version: String,
    selection: String,
    sources: Vec<SourceReport>,
    /// How sessions' process trees are followed and what that can miss.
    #[serde(skip_serializing_if = "Option::is_none")]
    membership: Option<MembershipStatus>,
    /// What cgroup support sessions have, and why none.
    #[serde(skip_serializing_if = "Option::is_none")]
    cgroup: Option<CgroupStatus>,
}

impl DaemonDoctor {
    fn of(status: Status) -> DaemonDoctor {
        DaemonDoctor {
            pid: status.daemon.pid,
            version: status.daemon.version,
            selection: status.monitor.selection,
            sources: status.monitor.sources,
            membership: status.membership,
            cgroup: status.cgroup,
        }
    }
}

#[derive(Debug, Serialize)]
struct ClientDoctor {
    pid: u32,
    euid: u32,
    kernel: String,
    /// `seccomp_mode`, `seccomp_filters`, `capabilities`.
    #[serde(flatten)]
    restrictions: Restrictions,
    sources: Vec<SourceReport>,
}

/// What this process could start, by probing the syscalls each source needs (harmlessly:
/// nothing is loaded, so the CLI needs no eBPF loader).
fn client_sources() -> Vec<SourceReport> {
    let source = |name, denial: Option<String>| SourceReport {
        name,
        state: if denial.is_some() {
            SourceState::Off
        } else {
            SourceState::Available
        },
        reason: denial,
        exit_status: None,
        self_test: None,
        stats: None,
        causes: None,
    };
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    let ebpf = diagnose::availability(&diagnose::BPF)
        .map(|denial| denial.to_string())
        .or_else(|| {
            (!btf.exists()).then(|| {
                format!(
                    "the kernel lacks BTF ({}): it needs CONFIG_DEBUG_INFO_BTF=y",
                    btf.display()
                )
            })
        });
    let pidfd = diagnose::availability(&diagnose::PIDFD_OPEN).map(|denial| denial.to_string());
    vec![
        source(SourceName::Ebpf, ebpf),
        source(SourceName::Pidfd, pidfd),
        source(SourceName::Procpoll, None),
    ]
}
