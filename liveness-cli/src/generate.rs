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
    /// `liveness.1` and one `liveness-SUBCOMMAND.1` per subcommand, in DIR.
    pub(crate) fn execute(&self, _: &Context) -> Result<ExitCode, Failure> {
        man_pages(&self.dir)?;
        Ok(Exit::Ok.into())
    }
}

fn man_pages(dir: &Path) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::new(Exit::IoErr, format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let command = Cli::command();
    write_page(dir, "liveness", command.clone()).map_err(io)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("liveness-{}", sub.get_name());
        write_page(dir, &name, sub.clone().bin_name(&name).display_name(&name)).map_err(io)?;
    }
    Ok(())
}

fn write_page(dir: &Path, name: &str, command: clap::Command) -> std::io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .title(name.to_uppercase())
        .render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)
}
