//! `liveness lock`: take, release and list locks held by sessions, and `lock run`.

use std::process::ExitCode;

use liveness_client::ClientError;
use liveness_common::protocol::ErrorCode;

use crate::args::{
    LockAcquireArgs, LockArgs, LockCommand, LockListArgs, LockReleaseArgs, LockRunArgs,
};
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::render::print_lock_table;

impl LockArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        match &self.command {
            LockCommand::Acquire(args) => args.execute(context),
            LockCommand::Release(args) => args.execute(context),
            LockCommand::List(args) => args.execute(context),
            LockCommand::Run(args) => args.execute(context),
        }
    }
}

impl LockAcquireArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let LockAcquireArgs {
            name,
            holder,
            wait,
            scope,
        } = self;
        let lock = context
            .connect()?
            .lock_acquire(
                name,
                &holder.session,
                holder.uid,
                wait.wait,
                wait.timeout,
                scope.scope(),
            )
            .map_err(refused)?;
        if context.json {
            output::json(&lock);
        } else {
            outln!("{}", lock.token);
        }
        Ok(Exit::Ok.into())
    }
}

/// A refused acquisition, with how to wait in the CLI's words: the daemon's message names
/// the holder only.
pub(crate) fn refused(error: ClientError) -> Failure {
    let wait = error.code() == Some(ErrorCode::LockHeld);
    let mut failure = Failure::from(error);
    if wait {
        failure.message.push_str("; wait for it with --wait");
    }
    failure
}

impl LockReleaseArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let LockReleaseArgs {
            name,
            holder,
            scope,
        } = self;
        let lock =
            context
                .connect()?
                .lock_release(name, &holder.session, holder.uid, scope.scope())?;
        if context.json {
            output::json(&lock);
        } else {
            outln!("released {} (token {})", lock.name, lock.token);
        }
        Ok(Exit::Ok.into())
    }
}

impl LockListArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let locks = context.connect()?.lock_list(self.uid)?;
        if context.json {
            output::json(&locks);
        } else {
            print_lock_table(&locks);
        }
        Ok(Exit::Ok.into())
    }
}

impl LockRunArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        (self.run).run_session(context, Some((&self.name, self.wait, self.scope)))
    }
}
