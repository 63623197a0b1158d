//! `liveness check` and `liveness resolve-owner`: process identities, read from `/proc`
//! without a daemon.

use std::process::ExitCode;

use liveness_common::identity::Identity;
use liveness_proc::identity::{IdentityError, Liveness, ProcRoot};

use crate::args::{CheckArgs, CheckTarget, ResolveOwnerArgs};
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::render::{print_identity, print_liveness};

impl CheckArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let proc = ProcRoot::default();
        match &self.target.0 {
            CheckTarget::Pid(pid) => match proc.capture(*pid) {
                Ok(identity) => {
                    print_identity(&identity, context.json);
                    Ok(Exit::Ok.into())
                }
                // For check, a process that is gone is an answer: dead.
                Err(IdentityError::NoSuchProcess(_)) => Err(Failure::new(
                    Exit::Dead,
                    format!("no process {pid}: it has exited (or is not in this PID namespace)"),
                )),
                Err(e) => Err(e.into()),
            },
            CheckTarget::Identity(text) => {
                let identity: Identity = serde_json::from_str(text).map_err(|e| {
                    Failure::new(Exit::DataErr, format!("invalid identity JSON: {e}"))
                })?;
                let liveness = proc.check(&identity);
                print_liveness(&identity, &liveness, context.json);
                Ok(match liveness {
                    Liveness::Alive => Exit::Ok,
                    Liveness::Dead(_) => Exit::Dead,
                    Liveness::Unknown(_) => Exit::Unknown,
                }
                .into())
            }
        }
    }
}

impl ResolveOwnerArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let start = self.pid.unwrap_or_else(|| {
            rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
        });
        let identity = ProcRoot::default().resolve_owner(start, &self.wrappers)?;
        print_identity(&identity, context.json);
        Ok(Exit::Ok.into())
    }
}
