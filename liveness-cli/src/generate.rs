//! Shell completions and man pages, generated from the clap definitions themselves so that
//! they can never disagree with `--help` (`cargo xtask dist` packages them).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::args::{Cli, CompletionsArgs, GenerateManArgs};
use crate::context::Context;
use crate::exit::{Exit, Failure};

impl CompletionsArgs {
    /// The completion script on stdout.
    pub(crate) fn execute(&self, _: &Context) -> Result<ExitCode, Failure> {
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut Cli::command(), "liveness", &mut script);
        let mut out = std::io::stdout().lock();
        out.write_all(&script)
            .and_then(|()| out.flush())
            .map_err(|e| Failure::new(Exit::IoErr, format!("cannot write the completions: {e}")))?;
        Ok(Exit::Ok.into())
    }
}

impl GenerateManArgs {
    /// `liveness.1` and one page per subcommand, nested ones too: `liveness-SUBCOMMAND.1`,
    /// `liveness-lock-acquire.1`.
    pub(crate) fn execute(&self, _: &Context) -> Result<ExitCode, Failure> {
        let dir = &self.dir;
        let io = |e: std::io::Error| Failure::new(Exit::IoErr, format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        write_pages(dir, "liveness", Cli::command()).map_err(io)?;
        Ok(Exit::Ok.into())
    }
}

/// The page of `command`, named `name`, then those of its subcommands.
fn write_pages(dir: &Path, name: &str, command: clap::Command) -> std::io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone())
        .title(name.to_uppercase())
        .render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("{name}-{}", sub.get_name());
        write_pages(dir, &name, sub.clone().bin_name(&name).display_name(&name))?;
    }
    Ok(())
}
