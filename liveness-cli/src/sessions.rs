//! The commands about sessions that are one request and its reply: `register`, `rename`,
//! `touch`, `end`, `get`, `list` and `whose`.

use std::process::ExitCode;

use serde::Serialize;

use liveness_client::{Owner, Registration, Whose};
use liveness_common::action::{ActionSpec, validate_actions};
use liveness_common::activity::{ActivityState, StallPolicy, TurnMark};
use liveness_common::protocol::Request;
use liveness_common::request;
use liveness_common::session::{OnEnd, Phase, Session, Until};

use crate::args::{
    EndActionArgs, EndArgs, GetArgs, ListArgs, OwnerArg, PhaseArg, RegisterArgs, RenameArgs,
    SessionArgs, StallArgs, StateArg, TouchArgs, TurnArg, WhoseArgs,
};
use crate::clock;
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::pids::{Here, Numbering};
use crate::render::{describe_session, print_session, print_session_table};

impl RegisterArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let registration = Registration {
            session: self.session.clone(),
            owner: self.owner.0.to_owner()?,
            pending: self.pending,
            labels: self.labels.iter().cloned().collect(),
            uid: self.uid,
            wrappers: self.wrappers.clone(),
            on_end: self.cleanup.on_end.map(OnEnd::from),
            grace: self.cleanup.grace,
            until: self.until.until.map(Until::from),
            on_end_run: self.end_actions.specs()?,
            on_stall: self.stall.policy()?,
            cgroup: self.cgroup.limits(),
            no_cgroup: self.cgroup.no_cgroup,
        };
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let registered = client.register_with_warnings(&registration)?;
        for warning in &registered.warnings {
            output::warn(warning, context.json);
        }
        print_session(&registered.session, context.json, &pids);
        Ok(Exit::Ok.into())
    }
}

impl EndActionArgs {
    /// The `--on-end-run` commands as end actions (`sh -c CMD` in the current directory),
    /// or `None` without any.
    pub(crate) fn specs(&self) -> Result<Option<Vec<ActionSpec>>, Failure> {
        if self.on_end_run.is_empty() {
            return Ok(None);
        }
        let cwd = current_dir("--on-end-run")?;
        let timeout_ms = self
            .on_end_timeout
            .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        let specs = self
            .on_end_run
            .iter()
            .map(|command| ActionSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), command.clone()],
                env: Vec::new(),
                timeout_ms,
                cwd: Some(cwd.clone()),
            })
            .collect::<Vec<_>>();
        validate_actions(&specs).map_err(|e| Failure::new(Exit::Usage, e))?;
        Ok(Some(specs))
    }
}

impl StallArgs {
    /// The stall policy the options give, or `None` without any.
    pub(crate) fn policy(&self) -> Result<Option<StallPolicy>, Failure> {
        let ms = |d: Option<std::time::Duration>| {
            d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        };
        let action = match &self.on_stall {
            Some(text) => {
                let cwd = text
                    .starts_with("run:")
                    .then(|| current_dir("--on-stall"))
                    .transpose()?;
                StallPolicy::parse_action(text, cwd)
                    .map_err(|e| Failure::new(Exit::Usage, format!("--on-stall: {e}")))?
            }
            None => StallPolicy::default(),
        };
        let policy = StallPolicy {
            stall_after_ms: ms(self.stall_after),
            spin_after_ms: ms(self.spin_after),
            tool_stall_after_ms: ms(self.tool_stall_after),
            ..action
        };
        if policy == StallPolicy::default() {
            return Ok(None);
        }
        policy
            .validate()
            .map_err(|e| Failure::new(Exit::Usage, e))?;
        Ok(Some(policy))
    }
}

/// The current directory, where `option`'s commands run.
fn current_dir(option: &str) -> Result<String, Failure> {
    let cwd = std::env::current_dir().map_err(|e| {
        Failure::new(
            Exit::IoErr,
            format!("cannot read the current directory for {option}: {e}"),
        )
    })?;
    cwd.to_str().map(str::to_owned).ok_or_else(|| {
        Failure::new(
            Exit::DataErr,
            format!("the current directory {} is not UTF-8", cwd.display()),
        )
    })
}

impl OwnerArg {
    /// The owner to register. `auto` stays a request to the daemon: it walks up from the
    /// caller's pid, which the kernel translates into the daemon's namespace
    /// (`SO_PEERCRED`), so no number crosses a namespace.
    fn to_owner(&self) -> Result<Owner, Failure> {
        match self {
            OwnerArg::Auto => Ok(Owner::Auto),
            OwnerArg::Pid(pid) => Ok(Owner::Pid(*pid)),
            OwnerArg::Identity(text) => {
                serde_json::from_str(text)
                    .map(Owner::Identity)
                    .map_err(|e| {
                        Failure::new(Exit::DataErr, format!("invalid --owner-identity JSON: {e}"))
                    })
            }
        }
    }
}

impl RenameArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let session = client.rename(&self.session, &self.to, self.uid)?;
        print_session(&session, context.json, &pids);
        Ok(Exit::Ok.into())
    }
}

impl TouchArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let SessionArgs { session, uid } = &self.session;
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let session = client.declare(&request::Touch {
            session: session.clone(),
            uid: *uid,
            turn: self.turn.map(|turn| match turn {
                TurnArg::Start => TurnMark::Start,
                TurnArg::End => TurnMark::End,
            }),
            tool: self.tool.clone(),
            tool_end: self.tool_end,
        })?;
        print_session(&session, context.json, &pids);
        Ok(Exit::Ok.into())
    }
}

impl EndArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let SessionArgs { session, uid } = &self.session;
        // The client's `end` never terminates; `--terminate` asks in the request itself.
        let request = Request::End(request::End {
            session: session.clone(),
            uid: *uid,
            terminate: self.terminate,
        });
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        if let Some(session) = &client.call(&request)?.session {
            print_session(session, context.json, &pids);
        }
        Ok(Exit::Ok.into())
    }
}

impl GetArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let SessionArgs { session, uid } = &self.session;
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let session = client.get(session, *uid)?;
        print_session(&session, context.json, &pids);
        Ok(Exit::Ok.into())
    }
}

impl ListArgs {
    /// Every page: text one session a line, JSON as one array.
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let phase = self.phase.map(|phase| match phase {
            PhaseArg::Active => Phase::Active,
            PhaseArg::Ended => Phase::Ended,
        });
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let mut sessions = client.list(phase)?;
        let state = self.state.map(|state| match state {
            StateArg::Working => ActivityState::Working,
            StateArg::Tool => ActivityState::Tool,
            StateArg::Idle => ActivityState::Idle,
            StateArg::Quiet => ActivityState::Quiet,
            StateArg::Stalled => ActivityState::Stalled,
            StateArg::Spinning => ActivityState::Spinning,
        });
        sessions.retain(|session| {
            self.labels.matches(&session.labels)
                && self.causes.matches(session.cause.as_ref())
                && state.is_none_or(|state| {
                    session.phase == Phase::Active
                        && session.activity.as_ref().is_some_and(|a| a.state == state)
                })
        });
        if context.json {
            output::json(&sessions);
        } else {
            let filtered = phase.is_some()
                || !self.labels.labels.is_empty()
                || self.causes.is_set()
                || state.is_some();
            print_session_table(&sessions, filtered, &pids);
        }
        Ok(Exit::Ok.into())
    }
}

impl WhoseArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let Whose { session, owner_pid } = client.whose(self.pid)?;
        if context.json {
            output::json(&WhoseJson {
                session: &session,
                owner_pid,
            });
        } else {
            // The owner as this command sees it: its pid here from the daemon (0: it is not
            // in this PID namespace), its name now from /proc.
            let here = (owner_pid != 0).then(|| Here {
                pid: owner_pid,
                comm: pids
                    .here(&session.owner)
                    .map_or_else(|| session.owner.comm.clone(), |here| here.comm),
            });
            let via = match session.ended_ms {
                // Only an ended session's survivors are named for it.
                Some(ended) => format!(
                    ", which left PID {} running when it ended at {}",
                    self.pid,
                    clock::local_time(ended)
                ),
                None if owner_pid == self.pid => String::new(),
                None => ", in its owner's process tree".to_owned(),
            };
            outln!("{}{via}", describe_session(&session, here, &pids));
        }
        Ok(Exit::Ok.into())
    }
}

/// `whose --json`: the session as `get --json` prints it, so that one path reads a field
/// of either, with the owner's pid in this command's PID namespace beside its fields.
#[derive(Serialize)]
struct WhoseJson<'a> {
    #[serde(flatten)]
    session: &'a Session,
    owner_pid: u32,
}
