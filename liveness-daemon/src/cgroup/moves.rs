//! The reader of the kernel's cgroup moves: each move of a tracked process or a member
//! (`tp_btf/cgroup_attach_task`, on a ring of its own) has the process's cgroup read on
//! the blocking pool, where a path whose depth a user chose costs no death anything, then
//! goes to the engine ([`Moved`]), which tells an escape from its sessions' cgroups and
//! records it once (docs/cgroups.md#escapes). Not the engine's task: its deaths never wait
//! for a move.

use std::collections::HashSet;

use liveness_common::identity::ProcessKey;
use liveness_ebpf::record::MoveRecord;
use liveness_proc::identity::ProcRoot;
use tokio::io::Interest;
use tokio::sync::watch;

use crate::engine::{Caller, Handle, Moved};
use crate::fair::offload::offload;
use crate::fd::registered::register;
use crate::source::ebpf::MoveRing;

/// Processes whose escape the engine recorded, kept so that a storm of moves of one (a
/// user moving her process among her own cgroups) costs a lookup each, not a read and a
/// turn of the engine; forgotten all at once past this many (the members map's default).
const MAX_ESCAPED: usize = 65_536;

/// Reads the moves until `stopped`.
pub async fn run(
    ring: MoveRing,
    engine: Handle,
    proc: ProcRoot,
    mut stopped: watch::Receiver<bool>,
) {
    let mut ring = match register(ring, Interest::READABLE) {
        Ok(ring) => ring,
        Err(error) => {
            tracing::warn!(error = %error.into_parts().1, "cannot wait on the eBPF moves ring; escapes are found at the sessions' ends only");
            return;
        }
    };
    let mut escaped: HashSet<ProcessKey> = HashSet::new();
    loop {
        let mut records = Vec::new();
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return,
            ready = ring.readable_mut() => match ready {
                Ok(mut guard) => {
                    guard.get_inner_mut().read(&mut records);
                    guard.clear_ready();
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the eBPF moves ring; escapes are found at the sessions' ends only");
                    return;
                }
            },
        }
        let moves: Vec<(ProcessKey, ProcessKey)> = records
            .iter()
            .map(keys)
            .filter(|(member, _)| !escaped.contains(member))
            .collect();
        if moves.is_empty() {
            continue;
        }
        let proc = proc.clone();
        let Some(read) = offload(move || {
            (moves.into_iter())
                .filter_map(|(member, root)| {
                    let cgroup = super::cgroup_of(member, &proc)?;
                    Some(Moved {
                        member,
                        root,
                        cgroup,
                    })
                })
                .collect::<Vec<_>>()
        })
        .await
        else {
            continue;
        };
        for moved in read {
            let member = moved.member;
            match engine.ask(Caller::DAEMON, moved).await {
                Ok(events) if !events.is_empty() => {
                    if escaped.len() >= MAX_ESCAPED {
                        escaped.clear();
                    }
                    escaped.insert(member);
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "cannot record an escape"),
            }
        }
    }
}

/// The moved process and the root of its tree.
fn keys(record: &MoveRecord) -> (ProcessKey, ProcessKey) {
    (
        ProcessKey {
            pid: record.tgid,
            start_ticks: record.start_ticks,
        },
        ProcessKey {
            pid: record.root_tgid,
            start_ticks: record.root_start_ticks,
        },
    )
}
