//! `liveness processes --session S`: the live processes of a session's tree.

use std::process::ExitCode;

use liveness_common::protocol::{MemberProcess, Request};
use liveness_common::request;

use crate::args::{ProcessesArgs, SessionArgs};
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::pids::Numbering;

impl ProcessesArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let SessionArgs { session, uid } = &self.session;
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        // Page after page: a big tree comes in several replies.
        let (mut processes, mut owner_session, mut after) = (Vec::new(), None, None);
        loop {
            let request = Request::Processes(request::Processes {
                session: session.clone(),
                uid: *uid,
                limit: None,
                after: after.take(),
            });
            let reply = client.call(&request)?;
            processes.extend(reply.processes.unwrap_or_default());
            owner_session = reply.session.or(owner_session);
            match reply.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        if context.json {
            output::json(&processes);
        } else if pids.differs() {
            // Run in another PID namespace than the daemon: the pid here first ("-" for a
            // process not seen here, or not known to be that one), then the daemon's pid
            // and parent, said to be its. The owner is looked for by the session's
            // identity of it, which has its pidfs inode.
            outln!(
                "{:>8} {:>10} {:>11} {:>10}  COMMAND",
                "PID",
                "DAEMON-PID",
                "DAEMON-PPID",
                "AGE"
            );
            for process in &processes {
                let identity = match &owner_session {
                    Some(session) if process.owner => &session.owner,
                    _ => &process.identity,
                };
                let here = pids
                    .here(identity)
                    .map_or_else(|| "-".to_owned(), |here| here.pid.to_string());
                outln!(
                    "{:>8} {:>10} {:>11} {:>10}  {}",
                    starred(process, here),
                    process.identity.pid,
                    process.ppid,
                    age(process.age_ms),
                    command(process)
                );
            }
        } else {
            outln!("{:>8} {:>8} {:>10}  COMMAND", "PID", "PPID", "AGE");
            for process in &processes {
                outln!(
                    "{:>8} {:>8} {:>10}  {}",
                    starred(process, process.identity.pid.to_string()),
                    process.ppid,
                    age(process.age_ms),
                    command(process)
                );
            }
        }
        Ok(Exit::Ok.into())
    }
}

/// A pid, starred for the session's owner.
fn starred(process: &MemberProcess, pid: String) -> String {
    if process.owner {
        format!("*{pid}")
    } else {
        pid
    }
}

/// Its command line, or `[comm]` where the arguments cannot be read.
fn command(process: &MemberProcess) -> String {
    if process.cmdline.is_empty() {
        format!("[{}]", process.identity.comm)
    } else {
        process.cmdline.join(" ")
    }
}

/// `3d4h`, `2h5m`, `4m10s`, `12s`.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60) {
        (0, 0, 0, s) => format!("{s}s"),
        (0, 0, m, s) => format!("{m}m{s}s"),
        (0, h, m, _) => format!("{h}h{m}m"),
        (d, h, _, _) => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_keep_the_two_largest_units() {
        assert_eq!(age(12_400), "12s");
        assert_eq!(age(250_000), "4m10s");
        assert_eq!(age((2 * 3600 + 5 * 60 + 7) * 1000), "2h5m");
        assert_eq!(age((3 * 86_400 + 4 * 3600) * 1000), "3d4h");
    }
}
