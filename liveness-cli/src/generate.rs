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
    let page = unfilled_extra(&String::from_utf8_lossy(&page));
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("{name}-{}", sub.get_name());
        write_pages(dir, &name, sub.clone().bin_name(&name).display_name(&name))?;
    }
    Ok(())
}

/// The page with its EXTRA section (the `after_help` text: exit-code tables, examples) in
/// no-fill mode. That text is laid out in columns already, as `--help` prints it; filled,
/// man would join and re-space its lines and the tables would no longer line up.
fn unfilled_extra(page: &str) -> String {
    const EXTRA: &str = ".SH EXTRA\n";
    let Some(start) = page.find(EXTRA).map(|at| at + EXTRA.len()) else {
        return page.to_owned();
    };
    let end = page[start..]
        .find("\n.SH ")
        .map_or(page.len(), |at| start + at + 1);
    format!(
        "{}.nf\n{}.fi\n{}",
        &page[..start],
        &page[start..end],
        &page[end..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page with an exit-code table keeps it as `--help` shows it: no-fill from the
    /// section's start to its end, with the table's lines as they were.
    #[test]
    fn the_exit_code_tables_are_not_reflowed() {
        let dir = tempfile::tempdir().unwrap();
        write_pages(dir.path(), "liveness", Cli::command()).unwrap();
        let mut tables = 0;
        for page in std::fs::read_dir(dir.path()).unwrap() {
            let text = std::fs::read_to_string(page.unwrap().path()).unwrap();
            let Some(extra) = text.split(".SH EXTRA\n").nth(1) else {
                continue;
            };
            let section = extra.split("\n.SH ").next().unwrap().trim_end();
            assert!(section.starts_with(".nf\n"), "{section}");
            assert!(section.ends_with("\n.fi"), "{section}");
            if section.contains("Exit codes (the same for every command)") {
                tables += 1;
                assert!(
                    section.contains("\n  66  not_found      no such session or process\n"),
                    "{section}"
                );
            }
        }
        assert!(
            tables >= 3,
            "the exit codes of liveness, get, wait...: {tables}"
        );
    }
}
