//! `cargo xtask agents`: liveness's hooks checked against the real agents. Each agent's npm
//! package is installed into `target/agents/NAME`, and run offline against the loopback
//! model stand-ins of the agents-offline kit (`fake_anthropic.py`, `fake_multi.py`) with a
//! temporary HOME, liveness's hooks installed beside a user's end command that appends its
//! input to `$HOME/end.log`, and a real `livenessd`: once to a clean exit, and once
//! SIGKILLed mid-turn (its model a listener that never answers). Slow, and it needs the
//! npm registry: outside `.ci/run`'s default path.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The user's end command: one JSON line per run in `$HOME/end.log`.
const END: &str = r#"cat >> "$HOME/end.log"; echo >> "$HOME/end.log""#;

/// Environment variables, as (name, value).
type Env = Vec<(String, String)>;

/// Which model stand-in an agent talks to.
#[derive(Debug, Clone, Copy)]
enum StandIn {
    Anthropic,
    Multi,
}

/// One agent as the check drives it.
struct Spec {
    /// liveness's adapter (`hooks install NAME`).
    name: &'static str,
    package: &'static str,
    /// Its command in `node_modules/.bin`.
    bin: &'static str,
    stand_in: StandIn,
    /// The arguments of a one-prompt run.
    args: &'static [&'static str],
    /// Whether the agent has an end hook, so a user's end command to run.
    end_hook: bool,
    /// Writes the agent's settings (and the user's end command) in HOME, for a model at
    /// PORT; the environment the agent runs with.
    setup: fn(&Path, u16) -> Result<Env>,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "claude-code",
        package: "@anthropic-ai/claude-code",
        bin: "claude",
        stand_in: StandIn::Anthropic,
        args: &["-p", "hello"],
        end_hook: true,
        setup: claude_code,
    },
    Spec {
        name: "codex",
        package: "@openai/codex",
        bin: "codex",
        stand_in: StandIn::Multi,
        args: &[
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-hook-trust",
            "hello",
        ],
        end_hook: true,
        setup: codex,
    },
    Spec {
        name: "gemini",
        package: "@google/gemini-cli",
        bin: "gemini",
        stand_in: StandIn::Multi,
        args: &["-p", "hello"],
        end_hook: true,
        setup: gemini,
    },
    Spec {
        name: "copilot",
        package: "@github/copilot",
        bin: "copilot",
        stand_in: StandIn::Multi,
        args: &["-p", "hello", "--allow-all-tools"],
        end_hook: true,
        setup: copilot,
    },
    Spec {
        name: "opencode",
        package: "opencode-ai",
        bin: "opencode",
        stand_in: StandIn::Multi,
        args: &["run", "hello"],
        end_hook: false,
        setup: opencode,
    },
];

fn write_json(path: &Path, value: &Value) -> Result<()> {
    fs::create_dir_all(path.parent().expect("a file in a directory"))?;
    fs::write(path, serde_json::to_string_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn vars(pairs: &[(&str, String)]) -> Env {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), value.clone()))
        .collect()
}

/// A Claude-style grouped `SessionEnd` hook running [`END`].
fn grouped_end(timeout: u64) -> Value {
    json!({"hooks": {"SessionEnd": [{"hooks": [
        {"type": "command", "command": END, "timeout": timeout}
    ]}]}})
}

fn claude_code(home: &Path, port: u16) -> Result<Env> {
    write_json(&home.join(".claude/settings.json"), &grouped_end(10))?;
    Ok(vars(&[
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
        ("ANTHROPIC_API_KEY", "sk-ant-api03-dummy".into()),
        ("ANTHROPIC_MODEL", "claude-sonnet-4-5".into()),
        ("ANTHROPIC_SMALL_FAST_MODEL", "claude-haiku-4-5".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_ERROR_REPORTING", "1".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
    ]))
}

fn codex(home: &Path, port: u16) -> Result<Env> {
    let dir = home.join(".codex");
    fs::create_dir_all(&dir)?;
    fs::write(
        dir.join("config.toml"),
        format!(
            "model = \"gpt-5\"\nmodel_provider = \"standin\"\n\n[model_providers.standin]\n\
             name = \"standin\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
             wire_api = \"responses\"\nenv_key = \"STANDIN_API_KEY\"\n"
        ),
    )?;
    write_json(&dir.join("hooks.json"), &grouped_end(10))?;
    Ok(vars(&[
        ("CODEX_HOME", dir.display().to_string()),
        ("STANDIN_API_KEY", "dummy".into()),
    ]))
}

fn gemini(home: &Path, port: u16) -> Result<Env> {
    let mut settings = grouped_end(10_000);
    settings["security"] = json!({"auth": {"selectedType": "gemini-api-key"}});
    write_json(&home.join(".gemini/settings.json"), &settings)?;
    Ok(vars(&[
        ("GEMINI_API_KEY", "dummy".into()),
        ("GOOGLE_GEMINI_BASE_URL", format!("http://127.0.0.1:{port}")),
        ("GEMINI_TELEMETRY_ENABLED", "false".into()),
        ("GEMINI_CLI_TRUST_WORKSPACE", "true".into()),
    ]))
}

fn copilot(home: &Path, port: u16) -> Result<Env> {
    write_json(
        &home.join(".copilot/hooks/notify.json"),
        &json!({"version": 1, "hooks": {"sessionEnd": [
            {"type": "command", "bash": END, "timeoutSec": 10}
        ]}}),
    )?;
    Ok(vars(&[
        ("COPILOT_OFFLINE", "true".into()),
        (
            "COPILOT_PROVIDER_BASE_URL",
            format!("http://127.0.0.1:{port}/v1"),
        ),
        ("COPILOT_PROVIDER_TYPE", "openai".into()),
        ("COPILOT_PROVIDER_API_KEY", "dummy".into()),
        ("COPILOT_MODEL", "gpt-5".into()),
        ("COPILOT_AUTO_UPDATE", "false".into()),
    ]))
}

fn opencode(home: &Path, port: u16) -> Result<Env> {
    write_json(
        &home.join(".config/opencode/opencode.json"),
        &json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"standin": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "standin",
                "options": {"baseURL": format!("http://127.0.0.1:{port}/v1"), "apiKey": "dummy"},
                "models": {"gpt-5": {"name": "gpt-5"}}
            }},
            "model": "standin/gpt-5",
            "autoupdate": false
        }),
    )?;
    Ok(vars(&[
        ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
        ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
        ("OPENCODE_DISABLE_SHARE", "1".into()),
    ]))
}

/// What `cargo xtask agents` was asked to do.
#[derive(Debug)]
pub struct Options {
    /// The agents-offline kit's directory (its model stand-ins).
    pub kit: PathBuf,
    /// Only these agents (all when empty).
    pub only: Vec<String>,
    pub json: bool,
}

/// One scenario's outcome.
#[derive(Debug, Clone, serde::Serialize)]
struct Outcome {
    /// `pass`, `fail` or `skipped`.
    result: &'static str,
    /// What was seen.
    seen: String,
}

impl Outcome {
    fn new(pass: bool, seen: String) -> Outcome {
        let result = if pass { "pass" } else { "fail" };
        Outcome { result, seen }
    }

    fn skipped(why: String) -> Outcome {
        Outcome {
            result: "skipped",
            seen: why,
        }
    }
}

pub fn run(root: &Path, options: &Options) -> Result<()> {
    for script in ["fake_anthropic.py", "fake_multi.py"] {
        if !options.kit.join(script).is_file() {
            bail!(
                "{} has no {script}: name the agents-offline kit with --kit",
                options.kit.display()
            );
        }
    }
    if let Some(unknown) = options
        .only
        .iter()
        .find(|name| !SPECS.iter().any(|spec| spec.name == name.as_str()))
    {
        bail!(
            "--only {unknown}: no such agent here (claude-code, codex, gemini, copilot, opencode)"
        );
    }
    crate::dist::build(root, "dev", &[], None)?;
    let bin = crate::target_dir(root).join("debug");
    let cache = crate::target_dir(root).join("agents");
    let work = tempfile::tempdir().context("a temporary directory")?;
    let daemon = Daemon::start(&bin, work.path())?;
    let mut rows = Vec::new();
    for spec in SPECS
        .iter()
        .filter(|spec| options.only.is_empty() || options.only.iter().any(|o| o == spec.name))
    {
        eprintln!("agents: {} ...", spec.name);
        let row = match install(&cache, spec) {
            Err(e) => {
                let why = Outcome::skipped(format!("{e:#}"));
                json!({"agent": spec.name, "version": null, "clean_exit": why, "sigkill": why})
            }
            Ok((program, version)) => {
                let check = Check {
                    spec,
                    program: &program,
                    bin: &bin,
                    daemon: &daemon,
                    kit: &options.kit,
                    work: work.path(),
                };
                json!({
                    "agent": spec.name,
                    "version": version,
                    "clean_exit": check.scenario(false),
                    "sigkill": check.scenario(true),
                })
            }
        };
        rows.push(row);
    }
    if options.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "agents": rows }))?
        );
    } else {
        println!("| agent | version | clean exit | SIGKILL |");
        println!("| --- | --- | --- | --- |");
        let cell = |o: &Value| {
            format!(
                "{}: {}",
                o["result"].as_str().unwrap_or("?"),
                o["seen"].as_str().unwrap_or("")
            )
        };
        for row in &rows {
            println!(
                "| {} | {} | {} | {} |",
                row["agent"].as_str().unwrap_or_default(),
                row["version"].as_str().unwrap_or("-"),
                cell(&row["clean_exit"]),
                cell(&row["sigkill"]),
            );
        }
    }
    if rows
        .iter()
        .any(|row| row["clean_exit"]["result"] == "fail" || row["sigkill"]["result"] == "fail")
    {
        bail!("an agent failed the check");
    }
    Ok(())
}

/// Installs the agent's package into `cache/NAME` unless it is there: its command and
/// version.
fn install(cache: &Path, spec: &Spec) -> Result<(PathBuf, String)> {
    let prefix = cache.join(spec.name);
    let manifest = prefix
        .join("node_modules")
        .join(spec.package)
        .join("package.json");
    if !manifest.is_file() {
        fs::create_dir_all(&prefix)?;
        let out = Process::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .arg(spec.package)
            .output()
            .context("running npm (install Node.js and npm)")?;
        if !out.status.success() {
            bail!(
                "npm install {} failed: {}",
                spec.package,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
            );
        }
    }
    let manifest: Value = serde_json::from_slice(&fs::read(&manifest)?)?;
    let version = manifest["version"].as_str().unwrap_or("?").to_owned();
    let program = prefix.join("node_modules/.bin").join(spec.bin);
    if !program.exists() {
        bail!("{} installs no {}", spec.package, spec.bin);
    }
    Ok((program, version))
}

/// A private `livenessd`, stopped when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(bin: &Path, work: &Path) -> Result<Daemon> {
        let socket = work.join("liveness.sock");
        let state = work.join("state");
        std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o700)
            .create(&state)
            .context("creating livenessd's state directory")?;
        let log_path = work.join("livenessd.log");
        let log = fs::File::create(&log_path)?;
        let child = Process::new(bin.join("livenessd"))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting livenessd")?;
        let daemon = Daemon { child, socket };
        if !eventually(Duration::from_secs(30), || daemon.socket.exists()) {
            bail!(
                "livenessd did not listen on {}: {}",
                daemon.socket.display(),
                fs::read_to_string(&log_path).unwrap_or_default().trim()
            );
        }
        Ok(daemon)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One agent's check.
struct Check<'a> {
    spec: &'a Spec,
    program: &'a Path,
    bin: &'a Path,
    daemon: &'a Daemon,
    kit: &'a Path,
    work: &'a Path,
}

/// A child process, with its process group killed when dropped.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Process::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

impl Check<'_> {
    fn scenario(&self, kill: bool) -> Outcome {
        self.try_scenario(kill)
            .unwrap_or_else(|e| Outcome::new(false, format!("{e:#}")))
    }

    fn try_scenario(&self, kill: bool) -> Result<Outcome> {
        let case = format!("{}-{}", self.spec.name, if kill { "kill" } else { "exit" });
        let home = self.work.join(&case);
        let project = home.join("project");
        fs::create_dir_all(&project)?;
        // SIGKILLed mid-turn: the model is a listener that never answers.
        let silent = TcpListener::bind("127.0.0.1:0")?;
        let port = match kill {
            true => silent.local_addr()?.port(),
            false => TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
        };
        let _model = match kill {
            true => None,
            false => Some(self.stand_in(port, &home)?),
        };
        let env = (self.spec.setup)(&home, port)?;
        let out = Process::new(self.bin.join("liveness"))
            .arg("--socket")
            .arg(&self.daemon.socket)
            .args(["hooks", "install", self.spec.name])
            .env("HOME", &home)
            .envs(env.iter().cloned())
            .output()?;
        if !out.status.success() {
            bail!(
                "hooks install: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let before: Vec<String> = self
            .sessions()?
            .iter()
            .map(|s| s["id"].to_string())
            .collect();
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Process::new(self.program);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let agent = Group(
            command
                .args(self.spec.args)
                .current_dir(&project)
                .env("HOME", &home)
                .env("PATH", path)
                .envs(env)
                .stdin(Stdio::null())
                .stdout(fs::File::create(home.join("agent.out"))?)
                .stderr(fs::File::create(home.join("agent.err"))?)
                .spawn()
                .with_context(|| format!("running {}", self.program.display()))?,
        );
        let ours = |sessions: Vec<Value>| {
            sessions.into_iter().find(|s| {
                s["labels"]["agent"] == self.spec.name && !before.contains(&s["id"].to_string())
            })
        };
        let mut session = None;
        let registered = eventually(Duration::from_secs(120), || {
            session = self.sessions().ok().and_then(ours);
            session.is_some()
        });
        let Some(found) = session.filter(|_| registered) else {
            return Ok(Outcome::new(
                false,
                format!("no session registered; {}", tail(&home)),
            ));
        };
        let id = found["id"].as_str().unwrap_or_default().to_owned();
        let comm = found["owner"]["comm"].as_str().unwrap_or("?").to_owned();
        if kill {
            let pid = found["owner"]["pid"].as_u64().unwrap_or_default();
            Process::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
        }
        let mut ended = Value::Null;
        let finished = eventually(Duration::from_secs(180), || {
            ended = self.session(&id).unwrap_or_default();
            ended["phase"] == "ended"
                && ended["actions"]
                    .as_array()
                    .is_none_or(|actions| actions.iter().all(|a| !a["outcome"].is_null()))
        });
        drop(agent);
        if !finished {
            return Ok(Outcome::new(
                false,
                format!("{id} (owner `{comm}`) did not end; {}", tail(&home)),
            ));
        }
        // An end command the agent runs may still be writing.
        std::thread::sleep(Duration::from_secs(1));
        let runs: Vec<Value> = fs::read_to_string(home.join("end.log"))
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.trim().is_empty())
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let by_daemon = runs.iter().filter(|r| r.get("liveness").is_some()).count();
        let signal = ended["exit"]["signal"].as_i64();
        let mut seen = format!(
            "owner `{comm}`, {} ({}), exit {}",
            ended["reason"].as_str().unwrap_or("?"),
            match signal {
                Some(signal) => format!("signal {signal}"),
                None => format!("code {}", ended["exit"]["code"]),
            },
            match ended["detected_by"].as_str() {
                Some(by) => format!("seen by {by}"),
                None => "-".into(),
            }
        );
        if !self.spec.end_hook {
            seen.push_str("; no end hook: tracked to its exit");
            let pass = if kill {
                signal == Some(9)
            } else {
                signal.is_none()
            };
            return Ok(Outcome::new(pass, seen));
        }
        seen.push_str(&format!(
            "; the end command ran {} time(s): {} by the agent, {by_daemon} by livenessd",
            runs.len(),
            runs.len() - by_daemon
        ));
        let pass = match kill {
            true => runs.len() == 1 && by_daemon == 1 && runs[0]["liveness"]["exit"]["signal"] == 9,
            // The agent's own end hook ran it: livenessd running it is the promise kept,
            // but not the agent's contract.
            false => runs.len() == 1 && by_daemon == 0,
        };
        Ok(Outcome::new(pass, seen))
    }

    /// The model stand-in for this agent, on `port`, killed when dropped.
    fn stand_in(&self, port: u16, home: &Path) -> Result<Group> {
        let script = match self.spec.stand_in {
            StandIn::Anthropic => "fake_anthropic.py",
            StandIn::Multi => "fake_multi.py",
        };
        let mut command = Process::new("python3");
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .arg(self.kit.join(script))
            .arg(port.to_string())
            .arg(home.join("model.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("running the model stand-in")?;
        let group = Group(child);
        if !eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            bail!("the model stand-in {script} did not listen");
        }
        Ok(group)
    }

    fn liveness_json(&self, args: &[&str]) -> Result<Value> {
        let out = Process::new(self.bin.join("liveness"))
            .arg("--socket")
            .arg(&self.daemon.socket)
            .arg("--json")
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "liveness {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    fn sessions(&self) -> Result<Vec<Value>> {
        let listed = self.liveness_json(&["list"])?;
        Ok(match listed {
            Value::Array(sessions) => sessions,
            other => other["sessions"].as_array().cloned().unwrap_or_default(),
        })
    }

    fn session(&self, id: &str) -> Result<Value> {
        let got = self.liveness_json(&["get", "--session", id])?;
        Ok(match got.get("session") {
            Some(session) => session.clone(),
            None => got,
        })
    }
}

/// The last lines of the agent's stderr, for a failure's reason.
fn tail(home: &Path) -> String {
    let err = fs::read_to_string(home.join("agent.err")).unwrap_or_default();
    let last: Vec<&str> = err.lines().rev().take(3).collect();
    format!(
        "agent stderr: {:?}",
        last.into_iter().rev().collect::<Vec<_>>().join(" / ")
    )
}
