//! Running the tools the tasks call (clang, dpkg, npm, strip...).

use std::process::Command as Process;

use anyhow::{Context, Result, ensure};

/// Runs a command, failing with its stderr unless it succeeds; returns its stdout.
pub fn output(command: &mut Process) -> Result<Vec<u8>> {
    let shown = format!("{command:?}");
    let result = command
        .output()
        .with_context(|| format!("running {shown}"))?;
    ensure!(
        result.status.success(),
        "{shown} failed ({}): {}",
        result.status,
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(result.stdout)
}
