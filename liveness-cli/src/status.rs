//! `liveness status`: the daemon's state.

use std::process::ExitCode;

use crate::args::StatusArgs;
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output;
use crate::pids::Numbering;
use crate::render::print_status;

impl StatusArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let mut client = context.connect()?;
        let pids = Numbering::of(&client);
        let status = client.status()?;
        if context.json {
            output::json(&status);
        } else {
            print_status(&status, &pids);
        }
        Ok(Exit::Ok.into())
    }
}
