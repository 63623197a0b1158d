//! What an agent's hook costs the agent: `liveness hooks gemini session-start` and
//! `session-end` timed from `sh -c` to exit, as an agent runs them, against a running
//! daemon, beside `sh -c true` and each installed agent CLI's own `--version`; then with
//! the daemon gone and frozen (SIGSTOP), where a hook gives up on it within its budget;
//! and while other hooks keep the daemon busy, where every registration must still get
//! through.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::Dist;
use crate::daemon;

#[derive(Debug, Clone, Copy)]
pub struct HooksPlan {
    /// Runs of each hook against the running daemon, and of `sh -c true`.
    pub runs: usize,
    /// Runs against a gone and a frozen daemon (each of those waits out the budget).
    pub unanswered: usize,
    /// Hooks run at once while the daemon is loaded, and how many each runs.
    pub load_workers: usize,
    pub load_runs: usize,
    /// Whether to time the agent CLIs found on PATH (seconds each).
    pub agents: bool,
}

/// The agent CLIs whose `--version` is timed when on PATH, by their binary's name.
const AGENT_CLIS: [&str; 7] = [
    "claude",
    "codex",
    "gemini",
    "copilot",
    "cursor-agent",
    "kiro-cli",
    "opencode",
];

/// Runs of each agent's `--version` (some take seconds).
const AGENT_RUNS: usize = 5;

/// One hook run: wall time in ns, and whether it said anything on stderr (a hook that
/// registered says nothing).
struct Ran {
    ns: u64,
    complained: bool,
}

/// Runs `sh -c LINE` with `input` on its stdin, timed from spawn to exit.
fn timed(line: &str, input: &[u8], env: &[(&str, &Path)]) -> Result<Ran> {
    let started = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", line])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running sh -c")?;
    // A hook reads its input to the end: the pipe is closed when `stdin` drops.
    child.stdin.take().context("no stdin")?.write_all(input)?;
    let out = child.wait_with_output()?;
    let ns = started.elapsed().as_nanos() as u64;
    if !out.status.success() {
        bail!("{line} exited with {}", out.status);
    }
    Ok(Ran {
        ns,
        complained: !out.stderr.is_empty(),
    })
}

fn ns(runs: &[Ran]) -> Vec<u64> {
    runs.iter().map(|r| r.ns).collect()
}

fn ms(dist: &Dist) -> (f64, f64) {
    (dist.p50 / 1e3, dist.p99 / 1e3)
}

/// Runs the plan against a daemon of `bin_dir`; a hook that fails to register or end
/// against a healthy daemon goes to `errors`.
pub fn run(bin_dir: &Path, plan: HooksPlan, errors: &mut Vec<String>) -> Result<Value> {
    let mut daemon = daemon::start(bin_dir, "pidfd", &[])?;
    // A HOME with no agent settings: the hook reads them for the user's end commands.
    let home = daemon.dir.path().join("home");
    std::fs::create_dir_all(&home)?;
    let env = [("HOME", home.as_path())];
    let liveness = bin_dir.join("liveness");
    let hook = |socket: &Path, which: &str| {
        format!(
            "{} --socket {} hooks gemini {which}",
            liveness.display(),
            socket.display()
        )
    };
    let payload = |session: &str| json!({"session_id": session, "cwd": "/"}).to_string();

    let (mut starts, mut ends, mut shells) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..plan.runs {
        let session = format!("hook-{i}");
        let input = payload(&session);
        shells.push(timed("true", b"", &env)?);
        starts.push(timed(
            &hook(&daemon.socket, "session-start"),
            input.as_bytes(),
            &env,
        )?);
        ends.push(timed(
            &hook(&daemon.socket, "session-end"),
            input.as_bytes(),
            &env,
        )?);
        let phase = daemon.session(&session)["phase"].clone();
        if phase != "ended" {
            errors.push(format!(
                "hooks: session {session} is {phase} after its session-end hook"
            ));
        }
    }
    let complained = starts.iter().chain(&ends).filter(|r| r.complained).count();
    if complained > 0 {
        errors.push(format!(
            "hooks: {complained} hooks said something on stderr against a healthy daemon"
        ));
    }

    let loaded = under_load(&daemon, &hook, plan, &env)?;
    if loaded.lost > 0 {
        errors.push(format!(
            "hooks: {} of {} registrations lost while {} hooks ran at once",
            loaded.lost, loaded.total, plan.load_workers
        ));
    }

    let gone = daemon.dir.path().join("gone.sock");
    let unanswered = |socket: &Path| -> Result<Vec<Ran>> {
        (0..plan.unanswered)
            .map(|i| {
                timed(
                    &hook(socket, "session-start"),
                    payload(&format!("unanswered-{i}")).as_bytes(),
                    &env,
                )
            })
            .collect()
    };
    let stopped = unanswered(&gone)?;
    daemon.signal(libc::SIGSTOP);
    let frozen = unanswered(&daemon.socket);
    daemon.signal(libc::SIGCONT);
    let frozen = frozen?;
    daemon::stop(&mut daemon)?;

    let agents = if plan.agents {
        agent_versions()?
    } else {
        Vec::new()
    };

    let [start, end, shell, loaded_dist, stopped, frozen] = [
        &ns(&starts),
        &ns(&ends),
        &ns(&shells),
        &loaded.ns,
        &ns(&stopped),
        &ns(&frozen),
    ]
    .map(|v| Dist::of_ns(v));
    let line = |what: &str, d: &Dist| {
        let (p50, p99) = ms(d);
        println!(
            "  {what:<44} p50 {p50:>7.2} ms  p99 {p99:>7.2} ms  max {:>7.2} ms",
            d.max / 1e3
        );
    };
    println!(
        "\nWhat a hook costs the agent, sh -c to exit ({} runs)",
        plan.runs
    );
    line("session-start (gemini)", &start);
    line("session-end (gemini)", &end);
    line("sh -c true", &shell);
    line(
        &format!(
            "session-start, {} at once ({} lost)",
            plan.load_workers, loaded.lost
        ),
        &loaded_dist,
    );
    line("session-start, no daemon", &stopped);
    line("session-start, daemon frozen (SIGSTOP)", &frozen);
    for agent in &agents {
        println!(
            "  {:<44} p50 {:>7.2} ms  ({} runs; {})",
            format!("{} --version", agent["agent"].as_str().unwrap_or_default()),
            agent["version_wall"]["p50_us"].as_f64().unwrap_or_default() / 1e3,
            AGENT_RUNS,
            agent["version"].as_str().unwrap_or_default(),
        );
    }
    Ok(json!({
        "runs": plan.runs,
        "session_start": start.json(),
        "session_end": end.json(),
        "sh_true": shell.json(),
        "under_load": {
            "at_once": plan.load_workers,
            "registrations": loaded.total,
            "lost": loaded.lost,
            "session_start": loaded_dist.json(),
        },
        "no_daemon": stopped.json(),
        "frozen_daemon": frozen.json(),
        "agents": agents,
    }))
}

/// Hooks' registrations while `plan.load_workers` of them run at once, over and over.
struct Loaded {
    ns: Vec<u64>,
    total: usize,
    lost: usize,
}

fn under_load(
    daemon: &daemon::Daemon,
    hook: &(dyn Fn(&Path, &str) -> String + Sync),
    plan: HooksPlan,
    env: &[(&str, &Path)],
) -> Result<Loaded> {
    let runs = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..plan.load_workers)
            .map(|w| {
                scope.spawn(move || -> Result<Vec<(String, Ran)>> {
                    (0..plan.load_runs)
                        .map(|i| {
                            let session = format!("load-{w}-{i}");
                            let input = json!({"session_id": session, "cwd": "/"}).to_string();
                            let ran = timed(
                                &hook(&daemon.socket, "session-start"),
                                input.as_bytes(),
                                env,
                            )?;
                            Ok((session, ran))
                        })
                        .collect()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a load worker panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    let runs: Vec<_> = runs.into_iter().flatten().collect();
    let lost = runs
        .iter()
        .filter(|(session, _)| {
            daemon.request(json!({"op": "get", "session": session}))["ok"] != true
        })
        .count();
    Ok(Loaded {
        ns: runs.iter().map(|(_, r)| r.ns).collect(),
        total: runs.len(),
        lost,
    })
}

/// Each agent CLI on PATH: its `--version` output and wall time.
fn agent_versions() -> Result<Vec<Value>> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut found = Vec::new();
    for name in AGENT_CLIS {
        let Some(binary) = std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|file| file.is_file())
        else {
            continue;
        };
        let (mut walls, mut version) = (Vec::new(), String::new());
        for _ in 0..AGENT_RUNS {
            let started = Instant::now();
            let out = Command::new(&binary)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("running {} --version", binary.display()))?;
            walls.push(started.elapsed().as_nanos() as u64);
            version = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
        }
        found.push(json!({
            "agent": name,
            "binary": PathBuf::from(&binary),
            "version": version,
            "version_wall": Dist::of_ns(&walls).json(),
        }));
    }
    Ok(found)
}
