//! systemd as the maker of session cgroups (docs/cgroups.md#systemd): where it is the init
//! and answers on the system bus, a session's cgroup is a transient scope
//! `liveness-s<uid>-<ms>-<pid>.scope` under `liveness.slice`, asked for with
//! `StartTransientUnit`, so that systemd stays the one writer of its tree. The daemon
//! reads the scope's cgroup files as any others; it kills what a scope holds with
//! `KillUnit` and stops a scope with `StopUnit`.
//!
//! No call here runs on the engine's thread: a scope is started by the connection that
//! asked for it once the engine has stored the session, killed from the reclaimer's
//! thread, and stopped on the runtime that serves connections.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use liveness_common::identity::ProcessKey;
use liveness_proc::identity::{Liveness, ProcRoot};
use liveness_proc::pidref::PidRef;
use zbus::zvariant::{Fd, OwnedObjectPath, OwnedValue, Value};

use super::{Hierarchy, Limits, SUBTREE};
use crate::source::cgroups::SessionCgroupNames;

const DESTINATION: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const UNIT: &str = "org.freedesktop.systemd1.Unit";
const SCOPE: &str = "org.freedesktop.systemd1.Scope";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
/// The prefix of the daemon's scopes: `liveness-s<uid>-<ms>-<pid>.scope`.
const PREFIX: &str = "liveness-";
/// How long the probe at the daemon's start may wait for the bus before the daemon makes
/// the session cgroups itself.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a bus call, or a scope's start job, may take before it is given up: D-Bus's
/// own default, which `systemd-run` waits too. systemd answers in turn, and after a burst
/// of ends it is collecting hundreds of scopes (over 5 s in the emulated test guest).
pub(super) const TIMEOUT: Duration = Duration::from_secs(25);
/// The first systemd whose `StartTransientUnit` takes `PIDFDs`, and whose scopes take
/// `OOMPolicy`.
const PIDFDS_SINCE: u32 = 253;
/// At most this many characters of a session id in a scope's `Description`.
const DESCRIBED: usize = 64;
/// At most this many of the daemon's calls wait for systemd's answer at once, and at most
/// [`STOPS_IN_FLIGHT`] of them are stops of ended sessions' scopes. The system bus refuses
/// a connection's call past 128 pending replies (dbus-daemon's
/// `max_replies_per_connection`, `LimitsExceeded`): a burst of ends stopping their scopes
/// made the next registration's scope fail. Calls past the bound queue, and a burst of
/// stops leaves half of it to the starts and kills.
const IN_FLIGHT: usize = 64;
const STOPS_IN_FLIGHT: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// Boxed: zbus's error is large, and this one travels in every cgroup error.
    #[error("the system bus: {0}")]
    Bus(Box<zbus::Error>),
    #[error("systemd did not answer within {} s", .0.as_secs())]
    Timeout(Duration),
    #[error("systemd's scope {unit} is {state}, not active")]
    NotActive { unit: String, state: String },
    #[error("the owner {pid} is gone")]
    OwnerGone { pid: u32 },
}

impl From<zbus::Error> for SystemdError {
    fn from(e: zbus::Error) -> SystemdError {
        SystemdError::Bus(Box::new(e))
    }
}

impl From<zbus::zvariant::Error> for SystemdError {
    fn from(e: zbus::zvariant::Error) -> SystemdError {
        SystemdError::Bus(Box::new(e.into()))
    }
}

/// systemd, found as the init at start, and the bus connection to it.
#[derive(Debug, Clone)]
pub struct Systemd {
    /// The manager's major version (`252` of `252.36-1~deb12u1`).
    pub version: u32,
    bus: Bus,
    /// The runtime the bus connection lives on, to call from other threads.
    runtime: tokio::runtime::Handle,
    /// The daemon's scopes systemd had when the daemon started (`ListUnitsByPatterns`),
    /// for the reconcile: asked at the probe, since the engine never waits on the bus.
    pub scopes: Vec<String>,
}

/// The connection is not compared: one systemd is one version.
impl PartialEq for Systemd {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version
    }
}
impl Eq for Systemd {}

/// A session's scope to start: its name, its description and its limits are the daemon's
/// making, never a user's string unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub unit: String,
    pub description: String,
    pub owner: ProcessKey,
    pub limits: Limits,
}

/// A registered session's scope, started by the connection that asked for it.
#[derive(Debug)]
pub struct ScopeStart {
    systemd: Systemd,
    scope: Scope,
    mount: PathBuf,
    /// The cgroup the session was stored with: `liveness.slice/<unit>` in the mount.
    expected: PathBuf,
    /// Where the scope systemd made is named once it exists.
    names: SessionCgroupNames,
}

impl ScopeStart {
    /// The start of `scope` by `systemd`, in `hierarchy` at `expected`.
    pub fn new(
        systemd: Systemd,
        scope: Scope,
        hierarchy: &Hierarchy,
        expected: PathBuf,
    ) -> ScopeStart {
        ScopeStart {
            systemd,
            scope,
            mount: hierarchy.mount.clone(),
            expected,
            names: hierarchy.names.clone(),
        }
    }

    /// The systemd that starts the scope, which attaches the tree's members to it too.
    pub fn systemd(&self) -> Systemd {
        self.systemd.clone()
    }

    /// The cgroup the session was stored with.
    pub fn expected(&self) -> &Path {
        &self.expected
    }

    /// Starts the scope with the owner in it: the warnings of what was not as asked, or
    /// the warning that it did not start (the session then has no cgroup to hold its
    /// processes, and the engine clears the one it was stored with).
    pub async fn run(self) -> Result<Vec<String>, String> {
        let unit = &self.scope.unit;
        let (cgroup, unset) = self.systemd.start(&self.scope).await.map_err(|e| {
            format!("the session has no cgroup: systemd did not start its scope {unit}: {e}")
        })?;
        let at = self.mount.join(cgroup.trim_start_matches('/'));
        self.names.name(&at);
        let elsewhere = (at != self.expected).then(|| {
            format!(
                "systemd made the scope {unit} at {}, not at {}: the session's cgroup is not followed",
                at.display(),
                self.expected.display()
            )
        });
        Ok(unset.into_iter().chain(elsewhere).collect())
    }
}

/// A unit as `ListUnits…` gives it: name, description, load state, active state, sub
/// state, followed unit, object path, job id, job type, job path.
type ListedUnit = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

/// The scope's name for user `uid`'s session created at `ms` with owner `pid`: digits only,
/// so no session id ever reaches a unit name.
pub fn unit_name(uid: u32, ms: i64, pid: u32) -> String {
    format!("{PREFIX}s{uid}-{ms}-{pid}.scope")
}

/// The unit of a cgroup of the daemon's under `liveness.slice`, if it is a scope.
pub fn unit_of(cgroup: &Path) -> Option<&str> {
    let name = cgroup.file_name()?.to_str()?;
    let parent = cgroup.parent()?.file_name()?;
    (parent == SUBTREE && name.starts_with(PREFIX) && name.ends_with(".scope")).then_some(name)
}

/// The `Description` of user `uid`'s session `id`: characters other than letters, digits
/// and `-_.:@+,/` become `_` (no control character, quote, `$`, `%` specifier or `\`
/// reaches systemd), and an id longer than [`DESCRIBED`] characters is cut, marked `…`.
pub fn description(uid: u32, id: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_.:@+,/".contains(c);
    let mut shown: String = id
        .chars()
        .take(DESCRIBED)
        .map(|c| if safe(c) { c } else { '_' })
        .collect();
    if id.chars().count() > DESCRIBED {
        shown.push('…');
    }
    format!("liveness session {shown} of uid {uid}")
}

impl Scope {
    /// `StartTransientUnit`'s properties for systemd `version`, the owner named by `pidfd`
    /// (253+) or its pid (252 and before), and what of the limits this systemd cannot
    /// set.
    pub fn properties<'a>(
        &'a self,
        version: u32,
        pidfd: Option<&'a PidRef>,
    ) -> (Vec<(&'static str, Value<'a>)>, Option<String>) {
        let mut properties: Vec<(&'static str, Value<'a>)> = vec![
            ("Description", Value::from(self.description.as_str())),
            ("Slice", Value::from(SUBTREE)),
            ("CollectMode", Value::from("inactive-or-failed")),
            // The counters the daemon reads at the end (docs/cgroups.md): systemd enables
            // the controllers only for accounted units.
            ("MemoryAccounting", Value::from(true)),
            ("TasksAccounting", Value::from(true)),
            ("CPUAccounting", Value::from(true)),
            ("IOAccounting", Value::from(true)),
        ];
        match pidfd {
            Some(pidfd) => {
                properties.push(("PIDFDs", Value::from(vec![Fd::from(pidfd)])));
            }
            None => properties.push(("PIDs", Value::from(vec![self.owner.pid]))),
        }
        let limits = &self.limits;
        for (name, value) in [
            ("MemoryMax", limits.memory_max),
            ("MemoryHigh", limits.memory_high),
            ("TasksMax", limits.tasks_max),
            ("CPUWeight", limits.cpu_weight),
        ] {
            if let Some(value) = value {
                properties.push((name, Value::from(value)));
            }
        }
        let mut unset = None;
        if limits.oom_group {
            if version >= PIDFDS_SINCE {
                // `kill`: memory.oom.group, the whole scope in one OOM kill.
                properties.push(("OOMPolicy", Value::from("kill")));
            } else {
                unset = Some(format!(
                    "systemd {version} has no OOMPolicy for scopes (253+): on_oom end is not applied, an OOM kill takes the process the kernel chooses"
                ));
            }
        }
        (properties, unset)
    }
}

impl Systemd {
    /// systemd where `/run/systemd/system` (`run_systemd`) exists, as sd_booted(3) tells,
    /// and the system bus answers; otherwise why not.
    pub async fn probe(run_systemd: &Path) -> Result<Systemd, String> {
        if !run_systemd.is_dir() {
            return Err(format!(
                "{} does not exist: systemd is not the init",
                run_systemd.display()
            ));
        }
        let probed = async {
            let bus = Bus::new(zbus::Connection::system().await?);
            let version: String = bus.property(MANAGER_PATH, MANAGER, "Version").await?;
            Ok::<_, SystemdError>((bus, version))
        };
        let (bus, version) = match tokio::time::timeout(PROBE_TIMEOUT, probed).await {
            Ok(Ok(probed)) => probed,
            Ok(Err(e)) => return Err(format!("systemd is the init, but {e}")),
            Err(_) => {
                return Err(format!(
                    "systemd is the init, but {}",
                    SystemdError::Timeout(PROBE_TIMEOUT)
                ));
            }
        };
        let mut systemd = Systemd {
            version: major(&version),
            bus,
            runtime: tokio::runtime::Handle::current(),
            scopes: Vec::new(),
        };
        // Without the list, the reconcile finds the scopes by their cgroups alone.
        match tokio::time::timeout(PROBE_TIMEOUT, systemd.list_scopes()).await {
            Ok(Ok(scopes)) => systemd.scopes = scopes,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot list the session scopes left behind; they are found by their cgroups")
            }
            Err(_) => tracing::warn!(
                "systemd did not list the session scopes left behind in time; they are found by their cgroups"
            ),
        }
        Ok(systemd)
    }

    /// The daemon's scopes (`liveness-*.scope`) that systemd has and that may still hold
    /// processes: not `inactive` or `failed` (those it collects).
    async fn list_scopes(&self) -> Result<Vec<String>, SystemdError> {
        let body = (Vec::<&str>::new(), vec![format!("{PREFIX}*.scope")]);
        let units: Vec<ListedUnit> = self.manager("ListUnitsByPatterns", &body).await?;
        Ok(units
            .into_iter()
            .filter(|unit| !matches!(unit.3.as_str(), "inactive" | "failed"))
            .map(|unit| unit.0)
            .collect())
    }

    /// Starts `scope` with the owner in it and waits for it to be active; its
    /// `ControlGroup` (`/liveness.slice/liveness-….scope`), and what of its limits this
    /// systemd could not set.
    pub async fn start(&self, scope: &Scope) -> Result<(String, Option<String>), SystemdError> {
        let pidfd = match self.version >= PIDFDS_SINCE {
            true => Some(
                PidRef::open(&ProcRoot::default(), scope.owner, None).map_err(|_| {
                    SystemdError::OwnerGone {
                        pid: scope.owner.pid,
                    }
                })?,
            ),
            false => None,
        };
        let (properties, unset) = scope.properties(self.version, pidfd.as_ref());
        let auxiliary: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        let started = async {
            self.manager::<OwnedObjectPath>(
                "StartTransientUnit",
                &(scope.unit.as_str(), "fail", properties, auxiliary),
            )
            .await?;
            // The start job runs at systemd's next turn: the scope is looked at until it
            // is active (a dead owner makes it fail), less and less often, so that a burst
            // of starts does not keep systemd answering polls instead of starting scopes.
            let mut pause = Duration::from_millis(5);
            loop {
                let unit: OwnedObjectPath =
                    self.manager("GetUnit", &(scope.unit.as_str(),)).await?;
                let state: String = self
                    .bus
                    .property(unit.as_str(), UNIT, "ActiveState")
                    .await?;
                match state.as_str() {
                    "active" => {
                        let cgroup: String = self
                            .bus
                            .property(unit.as_str(), SCOPE, "ControlGroup")
                            .await?;
                        return Ok(cgroup);
                    }
                    "activating" | "inactive" => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(100));
                    }
                    _ => {
                        return Err(SystemdError::NotActive {
                            unit: scope.unit.clone(),
                            state,
                        });
                    }
                }
            }
        };
        let cgroup = tokio::time::timeout(TIMEOUT, started)
            .await
            .map_err(|_| SystemdError::Timeout(TIMEOUT))??;
        Ok((cgroup, unset))
    }

    /// Attaches each of `strays` to `unit` (`AttachProcessesToUnit`, systemd 238+), each
    /// still the process it was (alive, its start time) just before, one call each: a
    /// process gone meanwhile fails its own call only, and is no error.
    pub async fn attach(
        &self,
        unit: &str,
        strays: &[ProcessKey],
        proc: &ProcRoot,
    ) -> Result<(), SystemdError> {
        let same = |key: &ProcessKey| proc.check_key(*key) == Liveness::Alive;
        for key in strays.iter().filter(|key| same(key)) {
            let body = (unit, "", vec![key.pid]);
            let attached = self.manager::<()>("AttachProcessesToUnit", &body);
            match tokio::time::timeout(TIMEOUT, attached).await {
                Err(_) => return Err(SystemdError::Timeout(TIMEOUT)),
                Ok(Err(_)) if !same(key) => {}
                Ok(attached) => attached?,
            }
        }
        Ok(())
    }

    /// Sends SIGKILL to every process of `unit`'s cgroup (systemd repeats until none is
    /// left, so a fork loop does not outrun it); from a thread outside the runtime.
    pub fn kill_blocking(&self, unit: &str) -> Result<(), SystemdError> {
        self.runtime.block_on(async {
            let body = (unit, "all", 9i32);
            let killed = self.manager::<()>("KillUnit", &body);
            tokio::time::timeout(TIMEOUT, killed)
                .await
                .map_err(|_| SystemdError::Timeout(TIMEOUT))?
        })
    }

    /// Stops `unit` if it is still there (systemd collects an emptied scope by itself), on
    /// the runtime, without waiting.
    pub fn stop_later(&self, unit: &str) {
        let (systemd, unit) = (self.clone(), unit.to_owned());
        self.runtime.spawn(async move {
            // The time limit starts once the stop's turn has come.
            let _turn = systemd
                .bus
                .stops
                .acquire()
                .await
                .expect("an open semaphore");
            let body = (unit.as_str(), "replace");
            let stopped = systemd.manager::<OwnedObjectPath>("StopUnit", &body);
            match tokio::time::timeout(TIMEOUT, stopped).await {
                Ok(Ok(_)) => {}
                Ok(Err(SystemdError::Bus(e)))
                    if matches!(&*e, zbus::Error::MethodError(name, _, _)
                        if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit") => {}
                Ok(Err(e)) => tracing::warn!(error = %e, unit, "cannot stop a session's scope"),
                Err(_) => tracing::warn!(unit, "systemd did not stop a session's scope in time"),
            }
        });
    }

    /// A call to the manager, and its answer.
    async fn manager<R>(
        &self,
        method: &str,
        body: &(impl serde::Serialize + zbus::zvariant::DynamicType),
    ) -> Result<R, SystemdError>
    where
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        self.bus.call(MANAGER_PATH, MANAGER, method, body).await
    }
}

/// The connection to the system bus, with at most [`IN_FLIGHT`] calls waiting for their
/// answers: every call of the daemon's to systemd goes through [`Bus::call`].
#[derive(Debug, Clone)]
struct Bus {
    connection: zbus::Connection,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// The turns of the stops ([`Systemd::stop_later`]): outside `in_flight`, which each
    /// stop's call takes besides, so stops hold at most [`STOPS_IN_FLIGHT`] of its permits.
    stops: Arc<tokio::sync::Semaphore>,
}

impl Bus {
    fn new(connection: zbus::Connection) -> Bus {
        Bus {
            connection,
            in_flight: Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT)),
            stops: Arc::new(tokio::sync::Semaphore::new(STOPS_IN_FLIGHT)),
        }
    }

    /// `interface.method(body)` of systemd's object at `path`, once fewer than
    /// [`IN_FLIGHT`] calls are waiting, and its answer.
    async fn call<R>(
        &self,
        path: &str,
        interface: &str,
        method: &str,
        body: &(impl serde::Serialize + zbus::zvariant::DynamicType),
    ) -> Result<R, SystemdError>
    where
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        // The semaphore is never closed.
        let _permit = self.in_flight.acquire().await.expect("an open semaphore");
        let reply = self
            .connection
            .call_method(Some(DESTINATION), path, Some(interface), method, body)
            .await?;
        Ok(reply.body().deserialize()?)
    }

    /// A property of the object at `path`.
    async fn property<T>(&self, path: &str, interface: &str, name: &str) -> Result<T, SystemdError>
    where
        T: TryFrom<OwnedValue>,
        T::Error: Into<zbus::Error>,
    {
        let value: OwnedValue = self
            .call(path, PROPERTIES, "Get", &(interface, name))
            .await?;
        T::try_from(value).map_err(|e| SystemdError::from(e.into()))
    }
}

/// The major version of systemd's `Version` (`252.36-1~deb12u1`, `v256`); 0 if none.
fn major(version: &str) -> u32 {
    version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(limits: Limits) -> Scope {
        Scope {
            unit: unit_name(1000, 1_700_000_000_000, 4242),
            description: description(1000, "build-7"),
            owner: ProcessKey {
                pid: 4242,
                start_ticks: 1,
            },
            limits,
        }
    }

    #[test]
    fn a_scope_is_named_by_the_daemon_and_found_again_from_its_cgroup() {
        let unit = unit_name(1000, 1_700_000_000_000, 4242);
        assert_eq!(unit, "liveness-s1000-1700000000000-4242.scope");
        let cgroup = Path::new("/sys/fs/cgroup/liveness.slice").join(&unit);
        assert_eq!(unit_of(&cgroup), Some(unit.as_str()));
        // The daemon's own cgroups (the cgroupfs path), and scopes elsewhere, are not its
        // units.
        assert_eq!(
            unit_of(Path::new("/sys/fs/cgroup/liveness.slice/s1000-1-2")),
            None
        );
        assert_eq!(
            unit_of(Path::new("/sys/fs/cgroup/user.slice/liveness-s0-1-2.scope")),
            None
        );
    }

    #[test]
    fn a_hostile_session_id_reaches_the_description_escaped_and_cut() {
        let hostile = "a\"b'c$(rm -rf /)%n\\\n\u{7}\u{1b}[31m;`x`";
        let described = description(0, hostile);
        assert_eq!(
            described,
            "liveness session a_b_c__rm_-rf_/__n_____31m__x_ of uid 0"
        );
        assert!(described.chars().all(|c| !c.is_control()));
        let long = "x".repeat(10_000);
        let described = description(7, &long);
        assert_eq!(
            described,
            format!("liveness session {}… of uid 7", "x".repeat(DESCRIBED))
        );
        // Multibyte characters are cut by character, never inside one.
        let wide = "é".repeat(100);
        assert!(description(7, &wide).contains(&"_".repeat(DESCRIBED)));
    }

    #[test]
    fn properties_carry_the_limits_and_the_owner_by_pid_before_253() {
        let limits = Limits {
            memory_max: Some(64 << 20),
            memory_high: Some(48 << 20),
            tasks_max: Some(16),
            cpu_weight: Some(50),
            oom_group: false,
        };
        let scope = scope(limits);
        let (properties, unset) = scope.properties(252, None);
        assert_eq!(unset, None);
        let find = |name: &str| {
            properties
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(find("Slice"), Some(Value::from("liveness.slice")));
        assert_eq!(find("CollectMode"), Some(Value::from("inactive-or-failed")));
        assert_eq!(find("PIDs"), Some(Value::from(vec![4242u32])));
        assert_eq!(find("PIDFDs"), None);
        assert_eq!(find("MemoryMax"), Some(Value::from(64u64 << 20)));
        assert_eq!(find("MemoryHigh"), Some(Value::from(48u64 << 20)));
        assert_eq!(find("TasksMax"), Some(Value::from(16u64)));
        assert_eq!(find("CPUWeight"), Some(Value::from(50u64)));
        assert_eq!(find("MemoryAccounting"), Some(Value::from(true)));
        assert_eq!(
            find("Description"),
            Some(Value::from("liveness session build-7 of uid 1000"))
        );
        assert_eq!(find("OOMPolicy"), None);
    }

    #[test]
    fn on_oom_end_is_oom_policy_kill_from_253_and_a_warning_before() {
        let limits = Limits {
            oom_group: true,
            ..Limits::default()
        };
        let scope = scope(limits);
        let (properties, unset) = scope.properties(252, None);
        assert!(properties.iter().all(|(n, _)| *n != "OOMPolicy"));
        assert!(unset.is_some_and(|w| w.contains("252")));
        let (properties, unset) = scope.properties(256, None);
        assert!(properties.contains(&("OOMPolicy", Value::from("kill"))));
        assert_eq!(unset, None);
        // No limit asked for: none is set (systemd's defaults, the slice's).
        let (properties, _) = scope.properties(256, None);
        assert!(properties.iter().all(|(n, _)| *n != "MemoryMax"));
    }

    #[test]
    fn the_major_version_is_read_from_what_systemd_says() {
        assert_eq!(major("252.36-1~deb12u1"), 252);
        assert_eq!(major("v256"), 256);
        assert_eq!(major("258~rc1"), 258);
        assert_eq!(major("unknown"), 0);
    }
}
