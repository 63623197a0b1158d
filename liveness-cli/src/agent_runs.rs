//! The runs of one agent session. An agent gives a resumed conversation (`--resume`,
//! `--continue`), a fork of it and a second resume of a live one the session id of the
//! run it came from, so one agent session id may have several runs, one after another or
//! at once. Each run is a liveness session of its own, owned by its agent process: the
//! first under the agent's session id, every later one under that id with `~PID-START`
//! (the agent's pid and start time) appended, and all of them labelled
//! [`SESSION_LABEL`]`=ID`, so that the earlier runs stay readable (`liveness list --label
//! agent_session=ID`). A hook acts only on the run its own agent owns: the end hook of a
//! fork never ends the run it forked.

use liveness_cli::hooks::SESSION_LABEL;
use liveness_client::{Client, ClientError, ErrorCode};
use liveness_common::identity::Identity;
use liveness_common::session::{Phase, Session};
use liveness_proc::identity::ProcRoot;

/// The most bytes a session id has (the protocol's limit).
const MAX_ID_BYTES: usize = 256;

/// The agent process this hook runs under, as `--owner auto` resolves it from the hook's
/// parent (the shell the agent ran it with, or the agent itself); `None` when it cannot
/// be resolved, and then the daemon's own resolution decides alone.
pub(crate) struct ThisAgent {
    proc: ProcRoot,
    parent: u32,
    agent: Option<Identity>,
}

impl ThisAgent {
    pub(crate) fn find() -> ThisAgent {
        let proc = ProcRoot::default();
        let parent = std::os::unix::process::parent_id();
        let agent = proc.resolve_owner(parent, &[]).ok();
        ThisAgent {
            proc,
            parent,
            agent,
        }
    }

    /// Whether `owner` is this agent. Processes are compared by start time and name,
    /// which do not depend on the PID namespace the hook runs in. The daemon's own
    /// `--wrapper` list may have taken it further up than this hook's resolution: an
    /// ancestor of another name is still this agent's run. One of the agent's own name
    /// above it is the run this one was forked from.
    fn owns(&self, owner: &Identity) -> bool {
        let Some(agent) = &self.agent else {
            return true;
        };
        let is_owner =
            |start_ticks: u64, comm: &str| owner.start_ticks == start_ticks && owner.comm == comm;
        is_owner(agent.start_ticks, &agent.comm)
            || (owner.comm != agent.comm
                && ancestors(&self.proc, self.parent)
                    .any(|(start_ticks, comm)| is_owner(start_ticks, &comm)))
    }

    /// A session id of this agent process's own, `NAME~PID-START`, for an agent that gives
    /// its hooks none: the same for every hook of the process, another for the next one.
    pub(crate) fn process_session(&self, name: &str) -> Option<String> {
        self.agent.is_some().then(|| self.run_id(name))
    }

    /// The id of a new run of `session` owned by this agent: `session~PID-START`, the
    /// session id cut at a character's end if the whole would exceed the protocol's limit.
    fn run_id(&self, session: &str) -> String {
        let Some(agent) = &self.agent else {
            return session.to_owned();
        };
        let suffix = format!("~{}-{}", agent.pid, agent.start_ticks);
        let mut end = session.len().min(MAX_ID_BYTES - suffix.len());
        while !session.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}{suffix}", &session[..end])
    }
}

/// Where a session-start hook registers its run.
pub(crate) enum StartAt {
    /// This agent's run is registered already (an agent fires its start hook again on
    /// `/clear` or a compaction): registered again, which changes only its end commands.
    Again(String),
    /// The first run of the session: under the agent's session id, unless that id turns
    /// out to be taken meanwhile by a run that ended (then `next`).
    First { next: String },
    /// A run while another one is live: under a run id of its own.
    New(String),
}

impl StartAt {
    /// The id to register first.
    pub(crate) fn id<'a>(&'a self, session: &'a str) -> &'a str {
        match self {
            StartAt::Again(id) | StartAt::New(id) => id,
            StartAt::First { .. } => session,
        }
    }

    /// The id to register when the first one was refused as ended: a resume of a run that
    /// ended.
    pub(crate) fn after_ended(self, error: &ClientError) -> Option<String> {
        match (self, error) {
            (
                StartAt::First { next },
                ClientError::Daemon {
                    code: ErrorCode::AlreadyEnded,
                    ..
                },
            ) => Some(next),
            _ => None,
        }
    }
}

/// The session `session` itself, when it exists (`None` when the daemon has no such
/// session of this user).
fn first_run(client: &mut Client, session: &str) -> Result<Option<Session>, ClientError> {
    match client.get(session, None) {
        Ok(run) => Ok(Some(run)),
        Err(ClientError::Daemon {
            code: ErrorCode::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The live run of `session` that `agent` owns, if any. The first run is looked at first,
/// so that the common case (one run) costs one `get`; the later runs are found by their
/// label in a `list` of the caller's live sessions.
fn live_run(
    client: &mut Client,
    agent: &ThisAgent,
    first: Option<&Session>,
    session: &str,
) -> Result<Option<String>, ClientError> {
    if let Some(first) = first.filter(|run| run.phase == Phase::Active)
        && agent.owns(&first.owner)
    {
        return Ok(Some(first.id.clone()));
    }
    let uid = rustix::process::geteuid().as_raw();
    Ok(client
        .list(Some(Phase::Active))?
        .into_iter()
        .find(|run| {
            run.creator_uid == uid
                && run.labels.get(SESSION_LABEL).map(String::as_str) == Some(session)
                && agent.owns(&run.owner)
        })
        .map(|run| run.id))
}

/// Where the start hook of `agent` registers its run of `session`.
pub(crate) fn start_at(
    client: &mut Client,
    agent: &ThisAgent,
    session: &str,
) -> Result<StartAt, ClientError> {
    let next = agent.run_id(session);
    // No first run: a new session (its later runs, had retention deleted the first
    // while they lived, are not looked for, which would cost every new session a `list`).
    let Some(first) = first_run(client, session)? else {
        return Ok(StartAt::First { next });
    };
    Ok(match live_run(client, agent, Some(&first), session)? {
        Some(ours) => StartAt::Again(ours),
        None => StartAt::New(next),
    })
}

/// The live run of `session` that `agent` owns, if any: the one its end and activity
/// hooks act on.
pub(crate) fn ours(
    client: &mut Client,
    agent: &ThisAgent,
    session: &str,
) -> Result<Option<String>, ClientError> {
    let first = first_run(client, session)?;
    live_run(client, agent, first.as_ref(), session)
}

/// `pid` and its ancestors, as (start time, name), up to init.
fn ancestors(proc: &ProcRoot, pid: u32) -> impl Iterator<Item = (u64, String)> + '_ {
    let mut next = Some(pid);
    std::iter::from_fn(move || {
        let stat = proc.stat(next?).ok()?;
        next = (stat.ppid > 1).then_some(stat.ppid);
        Some((stat.start_ticks, stat.comm))
    })
    .take(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(pid: u32, start_ticks: u64) -> ThisAgent {
        ThisAgent {
            proc: ProcRoot::default(),
            parent: 1,
            agent: Some(Identity {
                pid,
                start_ticks,
                boot_id: "b".into(),
                host: "h".into(),
                pidfs_ino: None,
                comm: "codex".into(),
            }),
        }
    }

    #[test]
    fn a_run_id_names_its_agent_and_keeps_within_the_protocol_s_limit() {
        assert_eq!(agent(41, 900).run_id("conv-1"), "conv-1~41-900");
        let long = "\u{e9}".repeat(128);
        let id = agent(4_194_304, u64::MAX).run_id(&long);
        assert!(id.len() <= MAX_ID_BYTES, "{}", id.len());
        assert!(id.ends_with(&format!("~4194304-{}", u64::MAX)), "{id}");
    }
}
