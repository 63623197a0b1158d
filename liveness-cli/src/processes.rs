//! `liveness processes --session S`: the live processes of a session's tree.

use std::process::ExitCode;

use liveness_common::protocol::{MemberProcess, Request};

use crate::args::{ProcessesArgs, SessionArgs};
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};

impl ProcessesArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let SessionArgs { session, uid } = &self.session;
        let request = Request::Processes {
            session: session.clone(),
            uid: *uid,
        };
        let processes = context.call(&request)?.processes.unwrap_or_default();
        if context.json {
            output::json(&processes);
        } else {
            outln!("{:>8} {:>8} {:>10}  COMMAND", "PID", "PPID", "AGE");
            for process in &processes {
                outln!("{}", describe(process));
            }
        }
        Ok(Exit::Ok.into())
    }
}

/// One line: pid (starred for the owner), parent, age and command line.
fn describe(process: &MemberProcess) -> String {
    let pid = format!(
        "{}{}",
        if process.owner { "*" } else { "" },
        process.identity.pid
    );
    let command = if process.cmdline.is_empty() {
        format!("[{}]", process.identity.comm)
    } else {
        process.cmdline.join(" ")
    };
    format!(
        "{pid:>8} {:>8} {:>10}  {command}",
        process.ppid,
        age(process.age_ms)
    )
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
