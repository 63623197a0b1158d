//! `register`: a new session, or a new turn (owner) of an ACTIVE one.

use std::os::fd::AsFd;
use std::path::Path;

use liveness_common::action::validate_actions;
use liveness_common::identity::Identity;
use liveness_common::protocol::{OwnerSpec, PidOwner, PidfdOwner};
use liveness_common::request::{self, CgroupLimits};
use liveness_common::session::{
    DEFAULT_GRACE_MS, MAX_GRACE_MS, OnEnd, OnOom, Phase, Session, SessionCgroup,
};
use liveness_proc::identity::{IdentityError, ProcRoot};

use super::{Op, stored};
use crate::cgroup;
use crate::cgroup::Enclosure;
use crate::cgroup::systemd::{self, Scope, ScopeStart};
use crate::engine::actor::Context;
use crate::engine::facts::Facts;
use crate::engine::owner_checks::launcher_warning;
use crate::engine::tree::Start;
use crate::engine::{Caller, Refusal, now_ms};
use crate::fd::pass::Passed;
use crate::store::NewSession;
use liveness_common::wire::wire_name;

/// A `register` request, with the descriptors that came with its line (a pidfd naming
/// the owner).
#[derive(Debug)]
pub struct Register {
    pub request: request::Register,
    /// A pidfd's close never blocks, so they may be dropped anywhere.
    pub fds: Vec<Passed>,
}

/// The session registered, and what succeeded but looks wrong.
#[derive(Debug)]
pub struct Registered {
    pub session: Session,
    pub warnings: Vec<String>,
    /// The session's scope, for the connection to ask systemd for once the session is
    /// stored: the engine never waits on the bus.
    pub scope: Option<ScopeStart>,
    /// The session's cgroup, for the connection to move the members its tree had at
    /// registration into (after the scope's start), off the engine.
    pub enclosure: Option<Enclosure>,
}

impl Op for Register {
    type Answer = Registered;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Registered, Refusal> {
        let Register { request, fds } = self;
        let now = cx.now();
        let auto = matches!(request.owner, OwnerSpec::Auto(_));
        let id = match (request.session, request.pending) {
            (Some(id), _) => id,
            (None, true) => generate_pending_id(),
            (None, false) => {
                return Err(Refusal::Invalid(
                    "`session` is required unless `pending` is true".into(),
                ));
            }
        };
        // Root registers in its own namespace unless it names a user's.
        let namespace = caller.namespace(request.uid)?.unwrap_or(caller.uid);
        let (on_end, grace_ms) = policy(request.on_end, request.grace_ms)?;
        if let Some(actions) = &request.on_end_run {
            validate_actions(actions).map_err(Refusal::Invalid)?;
        }
        if let Some(policy) = &request.on_stall {
            policy.validate().map_err(Refusal::Invalid)?;
        }
        let limits = cgroup_asked(request.cgroup.as_deref(), request.no_cgroup, cx.facts())?;
        check_limits(limits)?;
        let owner = resolve_owner(cx.facts(), caller, request.owner, request.wrappers, &fds)?;
        let (previous, ended) = match cx.store().get(namespace, &id)? {
            Some(existing) => {
                check_unchanged(&existing, request.on_end, request.grace_ms)?;
                if request.until.is_some_and(|until| until != existing.until) {
                    return Err(Refusal::Invalid(format!(
                        "session {:?} was registered with until {}: when a session ends is set when it is created; register without until, or use a new session id",
                        existing.id,
                        wire_name(existing.until)
                    )));
                }
                let ended = existing.phase == Phase::Ended;
                (Some(existing.owner), ended)
            }
            None => (None, false),
        };
        if previous.is_none() {
            cx.admit(caller.uid, &request.labels)?;
        }
        // An ended session is refused below, whatever its actions.
        if let Some(actions) = request
            .on_end_run
            .as_ref()
            .filter(|_| caller.uid != 0 && !ended)
        {
            // A new list replaces what the session has without an outcome (`actions_done`
            // may have given the others one).
            let (before, replaced) = cx.store().unfinished_actions(namespace, &id)?;
            let after = (before + actions.len() as u64).saturating_sub(replaced);
            cx.admit_actions(caller.uid, before, after)?;
        }
        let mut warnings = Vec::new();
        // A cgroup is made for a new session only, before it is stored (and removed again,
        // empty, if it is not); the owner is moved in once it is.
        let (cgroup, scope) = match limits.filter(|_| previous.is_none()) {
            Some(limits) => {
                let new = New {
                    uid: namespace,
                    id: &id,
                    now,
                    owner: &owner,
                };
                session_cgroup(cx.facts(), new, limits, &mut warnings)
            }
            None => (None, None),
        };
        let pending = request.pending;
        let new = NewSession {
            id: id.clone(),
            owner: owner.clone(),
            pending,
            pending_expires_ms: pending
                .then(|| now + cx.facts().config.pending_ttl.as_millis() as i64),
            creator_uid: namespace,
            labels: request.labels,
            on_end,
            grace_ms,
            until: request.until.unwrap_or_default(),
            on_end_run: request.on_end_run,
            on_stall: request.on_stall.map(|policy| *policy),
            cgroup: cgroup.clone(),
            // The group is the caller's own only when it registers for itself.
            creator_gid: (namespace == caller.uid).then_some(caller.gid),
        };
        let written = cx.write(|store| {
            let registered = store.register(new, now)?;
            Ok((registered.session, registered.event.into_iter().collect()))
        });
        // A scope is not started yet: nothing to discard, and systemd moves the owner.
        let made = cgroup.as_ref().filter(|_| scope.is_none());
        let (registered, events) = written.inspect_err(|_| {
            if let Some(cgroup) = made {
                discard(Path::new(&cgroup.path));
            }
        })?;
        if let Some(cgroup) = made
            && let Err(e) = cgroup::adopt(Path::new(&cgroup.path), owner.pid)
        {
            warnings.push(format!("the owner is not in the session's cgroup: {e}"));
        }
        if events.is_empty() {
            // The same owner again: its end actions may have been replaced.
            cx.follow(registered.clone());
        }
        if let Some(previous) = previous.filter(|p| !p.same_process(&owner)) {
            cx.unwatch(&previous);
        }
        if auto && let Some(warning) = launcher_warning(cx.facts().proc(), &owner) {
            warnings.push(warning);
        }
        let death = cx.watch(&owner, Start::Registration { uid: caller.uid });
        // A caller that started the owner itself (as `liveness run` does) waits for it and
        // knows its life: a short one is no mistake of its, so there is nothing to warn.
        let fresh = (death.is_none() && !started_by(cx.facts().proc(), &owner, caller.pid))
            .then(|| owner.key());
        // Before an owner dead already is ended: its cgroup is then reclaimed with it.
        let enclosure = cgroup.as_ref().map(|cgroup| Enclosure {
            path: cgroup.path.clone().into(),
            systemd: scope.as_ref().map(ScopeStart::systemd),
            uid: caller.creator_filter(),
        });
        let made = cgroup.map(|cgroup| (namespace, id.clone(), cgroup.path.into()));
        cx.announce(events, fresh, made);
        let Some(death) = death else {
            return Ok(Registered {
                session: registered,
                warnings,
                scope,
                enclosure,
            });
        };
        warnings.push(format!(
            "the owner {}[{}] has already exited: the session ended at once",
            owner.comm, owner.pid
        ));
        // A death's walk; the reply reads the session as the death left it.
        cx.finalize(death);
        cx.caught_up();
        let session = stored(cx.store(), namespace, &id)?;
        // The owner is gone: no scope can hold it, nor its cgroup its tree.
        Ok(Registered {
            session,
            warnings,
            scope: None,
            enclosure: None,
        })
    }

    fn about(registered: &Registered) -> Option<&Session> {
        Some(&registered.session)
    }
}

/// The cgroup a registration asks for: its own, none when it refuses one, else the
/// daemon's default (`--session-cgroup`), if any.
fn cgroup_asked(
    own: Option<&CgroupLimits>,
    none: bool,
    facts: &Facts,
) -> Result<Option<CgroupLimits>, Refusal> {
    match (own, none) {
        (Some(_), true) => Err(Refusal::Invalid(
            "`cgroup` and `no_cgroup` together: ask for a cgroup or refuse one".into(),
        )),
        (Some(limits), false) => Ok(Some(*limits)),
        (None, true) => Ok(None),
        (None, false) => Ok(facts.config.default_cgroup),
    }
}

/// Refuses limits of 0 (a cgroup nothing could run in) and a CPU weight the kernel has no
/// such value for, whether or not a cgroup is made.
fn check_limits(limits: Option<CgroupLimits>) -> Result<(), Refusal> {
    let Some(limits) = limits else {
        return Ok(());
    };
    for (name, value) in [
        ("memory_max", limits.memory_max),
        ("memory_high", limits.memory_high),
        ("tasks_max", limits.tasks_max),
    ] {
        if value == Some(0) {
            return Err(Refusal::Invalid(format!(
                "cgroup.{name} must be at least 1"
            )));
        }
    }
    if let Some(weight) = limits.cpu_weight.filter(|w| !CPU_WEIGHTS.contains(w)) {
        return Err(Refusal::Invalid(format!(
            "cgroup.cpu_weight {weight} is not between {} and {}",
            CPU_WEIGHTS.start(),
            CPU_WEIGHTS.end()
        )));
    }
    Ok(())
}

/// The values `cpu.weight` takes (the kernel's `CGROUP_WEIGHT_MIN` to `_MAX`).
const CPU_WEIGHTS: std::ops::RangeInclusive<u64> = 1..=10_000;

/// A new session of user `uid`'s, `id`, created at `now` with `owner`.
struct New<'a> {
    uid: u32,
    id: &'a str,
    now: i64,
    owner: &'a Identity,
}

/// An empty cgroup for a new session, or `None` with a warning where the host has no
/// usable cgroup2 or the cgroup cannot be made: a session is never refused for want of
/// one. Where systemd makes the cgroups, the scope to ask it for, and the cgroup it will
/// have. Its name is the daemon's, never the session id, so no id reaches the cgroup file
/// system or a unit's name.
fn session_cgroup(
    facts: &Facts,
    new: New<'_>,
    limits: CgroupLimits,
    warnings: &mut Vec<String>,
) -> (Option<SessionCgroup>, Option<ScopeStart>) {
    let support = &facts.config.cgroups;
    let Some(hierarchy) = support.hierarchy() else {
        warnings.extend(support.unusable_warning());
        return (None, None);
    };
    let New {
        uid,
        id,
        now,
        owner,
    } = new;
    let set = cgroup::Limits {
        memory_max: limits.memory_max,
        tasks_max: limits.tasks_max,
        memory_high: limits.memory_high,
        cpu_weight: limits.cpu_weight,
        oom_group: limits.on_oom == Some(OnOom::End),
    };
    let (made, scope) = match hierarchy.systemd() {
        Some(manager) => {
            let unit = systemd::unit_name(uid, now, owner.pid);
            let path = hierarchy.subtree.join(&unit);
            let scope = Scope {
                description: systemd::description(uid, id),
                unit,
                owner: owner.key(),
                limits: set,
            };
            let start = ScopeStart::new(manager.clone(), scope, hierarchy, path.clone());
            (Ok(path), Some(start))
        }
        None => (
            hierarchy.create(&format!("s{uid}-{now}-{}", owner.pid), &set),
            None,
        ),
    };
    match made {
        Ok(path) => (
            Some(SessionCgroup {
                path: path.display().to_string(),
                memory_max: limits.memory_max,
                tasks_max: limits.tasks_max,
                memory_high: limits.memory_high,
                cpu_weight: limits.cpu_weight,
                on_oom: limits.on_oom,
                usage: None,
                escaped: Vec::new(),
                unlisted: None,
            }),
            scope,
        ),
        Err(e) => {
            warnings.push(format!("the session has no cgroup: {e}"));
            (None, None)
        }
    }
}

/// Removes the empty cgroup of a registration that was not stored; what fails is logged.
fn discard(path: &Path) {
    if let Err(e) = cgroup::remove(path) {
        tracing::warn!(error = %e, "cannot remove an unused session cgroup");
    }
}

/// Whether `owner` is a child of the process `caller_pid` (0: not visible here).
fn started_by(proc: &ProcRoot, owner: &Identity, caller_pid: u32) -> bool {
    caller_pid != 0
        && proc
            .stat(owner.pid)
            .is_ok_and(|stat| stat.ppid == caller_pid && stat.start_ticks == owner.start_ticks)
}

/// The cleanup policy of a new session, or why the request is refused.
fn policy(on_end: Option<OnEnd>, grace_ms: Option<u64>) -> Result<(OnEnd, u64), Refusal> {
    let grace_ms = grace_ms.unwrap_or(DEFAULT_GRACE_MS);
    if grace_ms > MAX_GRACE_MS {
        return Err(Refusal::Invalid(format!(
            "grace_ms {grace_ms} is longer than the longest grace, {MAX_GRACE_MS} ms (one hour)"
        )));
    }
    Ok((on_end.unwrap_or_default(), grace_ms))
}

/// A registration of an existing session may repeat its policy, not change it.
fn check_unchanged(
    existing: &Session,
    on_end: Option<OnEnd>,
    grace_ms: Option<u64>,
) -> Result<(), Refusal> {
    let changed = on_end.is_some_and(|on_end| on_end != existing.on_end)
        || grace_ms.is_some_and(|grace| grace != existing.grace_ms);
    if !changed {
        return Ok(());
    }
    Err(Refusal::Invalid(format!(
        "session {:?} was registered with on_end {} and grace_ms {}: the cleanup policy is set when a session is created; register without on_end and grace_ms, or use a new session id",
        existing.id,
        wire_name(existing.on_end),
        existing.grace_ms
    )))
}

/// The identity of the owner a client names. A pid is read in the client's PID
/// namespace, a pidfd names its process directly; nothing is read in the daemon's
/// namespace on the client's word. `wrappers` are the request's own names `auto` skips.
fn resolve_owner(
    facts: &Facts,
    caller: Caller,
    spec: OwnerSpec,
    mut wrappers: Vec<String>,
    fds: &[Passed],
) -> Result<Identity, Refusal> {
    let proc = facts.proc();
    let identity = match spec {
        OwnerSpec::Auto(_) => {
            wrappers.extend(facts.config.wrappers.iter().cloned());
            proc.resolve_owner(caller.pid, &wrappers)?
        }
        OwnerSpec::Pid(PidOwner { pid }) => proc.capture_for(caller.pid, pid)?,
        OwnerSpec::Pidfd(PidfdOwner { pidfd }) => match fds.get(pidfd) {
            Some(Passed::Pidfd(fd)) => proc.capture_pidfd(fd.as_fd())?,
            Some(Passed::Refused(kind)) => {
                return Err(Refusal::NotPidfd {
                    index: pidfd,
                    kind: kind.to_string(),
                });
            }
            None => {
                return Err(Refusal::Invalid(format!(
                    "the owner is descriptor {pidfd} of the request line, but {} came with it: send the pidfd with SCM_RIGHTS in the sendmsg that carries the line",
                    fds.len()
                )));
            }
        },
        OwnerSpec::Identity(identity) if identity.boot_id == facts.boot_id => {
            // Captured by the client (`liveness check`), so in its numbering, like
            // any pid it sends. One that is not found there stays as given: its start
            // time then tells whether it names a live process.
            let pid = proc
                .translate_pid(caller.pid, identity.pid)
                .unwrap_or(identity.pid);
            canonical(proc, Identity { pid, ..identity })?
        }
        OwnerSpec::Identity(identity) => identity,
    };
    // Only root may attach sessions to other users' processes. A process that is gone
    // can no longer be checked, and its session ends at once anyway.
    if !caller.is_root() && identity.boot_id == facts.boot_id {
        match proc.uid(identity.pid) {
            Ok(uid) if uid != caller.uid => {
                return Err(Refusal::OthersProcess {
                    pid: identity.pid,
                    uid,
                    caller: caller.uid,
                });
            }
            _ => {}
        }
    }
    Ok(identity)
}

/// An identity of this boot from a client, as the daemon reads it: a kernel thread is
/// refused, and where the pidfs inode names the live process, the daemon's own reading
/// of its start time is kept: a client in a time namespace whose offset is not whole
/// ticks reads the start time as the kernel's count or one more. An identity of a
/// process that is gone is kept as given: its session ends at once.
fn canonical(proc: &ProcRoot, identity: Identity) -> Result<Identity, Refusal> {
    match proc.capture(identity.pid) {
        Ok(live)
            if live.pidfs_ino.is_some()
                && live.pidfs_ino == identity.pidfs_ino
                && identity.start_ticks == live.start_ticks + 1 =>
        {
            Ok(Identity {
                host: identity.host,
                ..live
            })
        }
        Err(e @ IdentityError::KernelThread { .. }) => Err(e.into()),
        _ => Ok(identity),
    }
}

/// A fresh id for a pending session: random, so ids are never reused across restarts.
fn generate_pending_id() -> String {
    let mut bytes = [0u8; 8];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        bytes = now_ms().to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("pending-{hex}")
}
