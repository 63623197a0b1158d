//! The fleet mirror (`--etcd`): this host's presence, its ACTIVE sessions and the record
//! of their ends, written into etcd (docs/fleet.md).
//!
//! The host is the truth and etcd its mirror (design invariant 15): the mirror reads the
//! daemon's own socket as any subscriber does, with a cursor of its own kept in etcd, so a
//! slow or absent etcd only makes it lag (and the daemon drops it as it drops any lagging
//! subscriber); it never delays a death. After an outage it resumes from its cursor and
//! re-reads the ACTIVE sessions; every write is idempotent and carries the store id and the
//! seq it stems from.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use liveness_common::status::ClusterStatus;

#[cfg(feature = "fleet")]
mod locks;
#[cfg(feature = "fleet")]
mod mirror;
#[cfg(feature = "fleet")]
mod view;

/// Runs `work` on a thread and a runtime of its own at niceness `nice`, below the engine's:
/// the fleet's readers of the daemon's own stream (the mirror, the fleet locks' follower)
/// and their etcd clients never take the CPU from a death's delivery to subscribers.
#[cfg(feature = "fleet")]
pub(crate) fn spawn_below(
    what: &'static str,
    nice: i32,
    work: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        crate::fair::offload::lower_this_thread(nice);
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(work),
            Err(e) => tracing::error!(error = %e, what, "cannot start a fleet runtime"),
        }
    })
}

#[cfg(feature = "fleet")]
pub(crate) use locks::FleetLocks;
#[cfg(feature = "fleet")]
pub(crate) use mirror::run;
#[cfg(feature = "fleet")]
pub(crate) use view::FleetReader;

/// Without the feature there are no fleet locks: `--etcd` is refused at start.
#[cfg(not(feature = "fleet"))]
#[derive(Debug, Clone)]
pub(crate) enum FleetLocks {}

#[cfg(not(feature = "fleet"))]
impl FleetLocks {
    pub(crate) fn start(
        _: FleetConfig,
        _: crate::engine::Handle,
        _: PathBuf,
        _: tokio::sync::watch::Receiver<bool>,
    ) -> FleetLocks {
        unreachable!("FleetConfig::new refuses --etcd in a build without the fleet feature")
    }

    pub(crate) async fn acquire(
        &self,
        _: &crate::engine::Handle,
        _: crate::engine::Caller,
        _: liveness_common::request::LockAcquire,
        _: impl Future<Output = liveness_common::protocol::ErrorBody>,
    ) -> Result<liveness_common::lock::Lock, liveness_common::protocol::ErrorBody> {
        match *self {}
    }

    pub(crate) async fn release(
        &self,
        _: &crate::engine::Handle,
        _: crate::engine::Caller,
        _: liveness_common::request::LockRelease,
    ) -> Result<liveness_common::lock::Lock, liveness_common::protocol::ErrorBody> {
        match *self {}
    }
}

#[cfg(feature = "fleet")]
impl From<FleetError> for liveness_common::protocol::ErrorBody {
    fn from(error: FleetError) -> liveness_common::protocol::ErrorBody {
        use liveness_common::protocol::{ErrorBody, ErrorCode};
        ErrorBody::new(ErrorCode::Internal, format!("fleet: {error}"))
    }
}

/// Without the feature there is no fleet to read: `--etcd` is refused at start.
#[cfg(not(feature = "fleet"))]
#[derive(Debug, Clone)]
pub(crate) enum FleetReader {}

#[cfg(not(feature = "fleet"))]
pub(crate) enum Watch {}

#[cfg(not(feature = "fleet"))]
impl FleetReader {
    pub(crate) fn new(_: FleetConfig) -> FleetReader {
        unreachable!("FleetConfig::new refuses --etcd in a build without the fleet feature")
    }

    pub(crate) async fn view(
        &self,
        _: crate::engine::Caller,
        _: &liveness_common::request::Fleet,
    ) -> Result<liveness_common::fleet::FleetView, liveness_common::protocol::ErrorBody> {
        match *self {}
    }

    pub(crate) async fn watch(
        &self,
        _: crate::engine::Caller,
        _: i64,
        _: std::collections::BTreeMap<String, String>,
    ) -> Result<Watch, liveness_common::protocol::ErrorBody> {
        match *self {}
    }
}

#[cfg(not(feature = "fleet"))]
impl Watch {
    pub(crate) async fn next(
        &mut self,
    ) -> Result<Option<Vec<liveness_common::fleet::FleetChange>>, FleetError> {
        match *self {}
    }
}

/// Why the mirror could not start or lost etcd.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FleetError {
    #[error("this livenessd was built without the `fleet` feature: --etcd needs it")]
    NotBuiltIn,
    #[error("no host id: /etc/machine-id cannot be read ({0}); give --host-id")]
    NoMachineId(std::io::Error),
    #[error("--etcd-password-file {path}: {reason}")]
    PasswordFile { path: PathBuf, reason: String },
    #[error("{flag} {path}: {reason}")]
    TlsFile {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("--etcd {url}: {reason}")]
    Endpoint { url: String, reason: &'static str },
    #[cfg(feature = "fleet")]
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[cfg(feature = "fleet")]
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    #[cfg(feature = "fleet")]
    #[error("the host lease expired or was revoked")]
    LeaseLost,
    #[cfg(feature = "fleet")]
    #[error(
        "another daemon (on {hostname:?}) is online as host {host_id:?}: give each daemon \
         its own --host-id"
    )]
    HostTaken { host_id: String, hostname: String },
    #[cfg(feature = "fleet")]
    #[error("this daemon's event stream ended")]
    StreamEnded,
    #[cfg(feature = "fleet")]
    #[error("this daemon's socket: {0}")]
    Local(#[from] liveness_client::ClientError),
    #[cfg(feature = "fleet")]
    #[error("a record in etcd: {0}")]
    Json(#[from] serde_json::Error),
}

/// What `--etcd` and its companions ask for.
#[derive(Debug, Clone)]
// Without the feature, `new` never makes one: only the mirror reads the rest.
#[cfg_attr(not(feature = "fleet"), allow(dead_code))]
pub(crate) struct FleetConfig {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub host_id: String,
    pub ttl: Duration,
    pub ended_retention: Duration,
    pub credentials: Option<Credentials>,
    /// With `https://` endpoints.
    pub tls: Option<Tls>,
}

/// What the TLS connection to etcd trusts and shows (`--etcd-cacert`, `--etcd-cert`,
/// `--etcd-key`), in PEM.
#[derive(Clone)]
#[cfg_attr(not(feature = "fleet"), allow(dead_code))]
pub(crate) struct Tls {
    /// The CA that signed etcd's certificate.
    pub ca: String,
    /// This daemon's certificate and key, for etcd's `--client-cert-auth`.
    pub identity: Option<(String, String)>,
}

/// The key never reaches a log line.
impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// An etcd user and its password (`--etcd-user`, `--etcd-password-file`).
#[derive(Clone)]
#[cfg_attr(not(feature = "fleet"), allow(dead_code))]
pub(crate) struct Credentials {
    pub user: String,
    pub password: String,
}

/// The password never reaches a log line.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What `--etcd` and its companions say, as given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FleetArgs<'a> {
    pub endpoints: &'a [String],
    pub prefix: &'a str,
    pub host_id: Option<&'a str>,
    pub ttl: Duration,
    pub ended_retention: Duration,
    pub user: Option<&'a str>,
    pub password_file: Option<&'a Path>,
    pub cacert: Option<&'a Path>,
    /// `--etcd-cert` and `--etcd-key`, which go together.
    pub identity: Option<(&'a Path, &'a Path)>,
}

impl FleetConfig {
    /// The configuration, or `None` without `--etcd`. The host id defaults to the machine
    /// id; a build without the feature refuses `--etcd` at start rather than ignore it.
    pub(crate) fn new(args: FleetArgs<'_>) -> Result<Option<FleetConfig>, FleetError> {
        if args.endpoints.is_empty() {
            return Ok(None);
        }
        if cfg!(not(feature = "fleet")) {
            return Err(FleetError::NotBuiltIn);
        }
        let host_id = match args.host_id {
            Some(id) => id.to_owned(),
            None => machine_id().map_err(FleetError::NoMachineId)?,
        };
        let credentials = match (args.user, args.password_file) {
            (Some(user), Some(path)) => Some(Credentials {
                user: user.to_owned(),
                password: read_password(path)?,
            }),
            _ => None,
        };
        Ok(Some(FleetConfig {
            endpoints: args.endpoints.to_vec(),
            prefix: args.prefix.to_owned(),
            host_id,
            ttl: args.ttl,
            ended_retention: args.ended_retention,
            credentials,
            tls: tls(&args)?,
        }))
    }
}

/// The TLS setup, read and checked at start: every endpoint `https://` with a CA to trust,
/// or `http://` without any TLS flag.
fn tls(args: &FleetArgs<'_>) -> Result<Option<Tls>, FleetError> {
    let secure = args.cacert.is_some() || args.identity.is_some();
    for url in args.endpoints {
        let reason = match (
            url.starts_with("https://"),
            url.starts_with("http://"),
            secure,
        ) {
            (true, _, false) => {
                "an https:// endpoint needs --etcd-cacert, the CA etcd's certificate is signed by"
            }
            (false, true, true) => {
                "with --etcd-cacert, --etcd-cert or --etcd-key, give https:// endpoints"
            }
            (false, false, _) => "an endpoint is an http:// or https:// URL",
            _ => continue,
        };
        return Err(FleetError::Endpoint {
            url: url.clone(),
            reason,
        });
    }
    let Some(cacert) = args.cacert else {
        return Ok(None);
    };
    let pem = |flag: &'static str, path: &Path, text: String, marker: &str| {
        if text.contains(marker) {
            Ok(text)
        } else {
            Err(FleetError::TlsFile {
                flag,
                path: path.into(),
                reason: format!("no PEM block ({marker}) in it"),
            })
        }
    };
    let public = |flag: &'static str, path: &Path| {
        let text = std::fs::read_to_string(path).map_err(|e| FleetError::TlsFile {
            flag,
            path: path.into(),
            reason: e.to_string(),
        })?;
        pem(flag, path, text, "-----BEGIN CERTIFICATE-----")
    };
    let ca = public("--etcd-cacert", cacert)?;
    let identity = match args.identity {
        None => None,
        Some((cert, key)) => {
            let cert = public("--etcd-cert", cert)?;
            let text = read_private(key).map_err(|reason| FleetError::TlsFile {
                flag: "--etcd-key",
                path: key.into(),
                reason,
            })?;
            Some((cert, pem("--etcd-key", key, text, "PRIVATE KEY-----")?))
        }
    };
    Ok(Some(Tls { ca, identity }))
}

/// The password file's first line (see [`read_private`]).
fn read_password(path: &Path) -> Result<String, FleetError> {
    let refuse = |reason: String| FleetError::PasswordFile {
        path: path.into(),
        reason,
    };
    let text = read_private(path).map_err(refuse)?;
    let password = text.lines().next().unwrap_or_default().to_owned();
    if password.is_empty() {
        return Err(refuse("empty".into()));
    }
    Ok(password)
}

/// A secret's file (a password, a private key), at most 64 KiB. Only the daemon's user
/// (or root) may own it, and nobody else may read or write it; a link is refused, not
/// followed.
fn read_private(path: &Path) -> Result<String, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "owned by uid {}, not by this daemon's user or root",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "mode {:o}: others may read or write it (chmod 600)",
            meta.mode() & 0o777
        ));
    }
    let mut text = String::new();
    file.take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}

/// The machine id, which stays the same across reboots and host name changes.
fn machine_id() -> std::io::Result<String> {
    let id = std::fs::read_to_string("/etc/machine-id")?;
    parse_host_id(id.trim()).map_err(std::io::Error::other)
}

/// A fleet lock's name as one segment of a key: `/` and `%` escaped, so that no name's
/// keys fall under another name's prefix (`a` and `a/b`). Here, outside the fleet locks'
/// module, so that the default build's tests check it too.
#[cfg_attr(not(feature = "fleet"), allow(dead_code))]
pub(crate) fn lock_segment(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// A host id is one key segment: no `/`, nothing a terminal or a shell would read
/// differently.
pub(crate) fn parse_host_id(text: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if text.is_empty() || text.len() > 128 || !text.chars().all(allowed) {
        return Err(format!(
            "{text:?}: a host id is 1 to 128 letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(text.to_owned())
}

/// A prefix starts with `/`, does not end with one, and is printable ASCII.
pub(crate) fn parse_prefix(text: &str) -> Result<String, String> {
    let printable = text.chars().all(|c| c.is_ascii_graphic());
    if !text.starts_with('/') || text.ends_with('/') || !printable || text.len() > 256 {
        return Err(format!(
            "{text:?}: a prefix starts with '/', does not end with one, and is at most 256 \
             printable ASCII characters"
        ));
    }
    Ok(text.to_owned())
}

/// etcd's leases count whole seconds.
pub(crate) fn parse_ttl(text: &str) -> Result<Duration, String> {
    let duration = liveness_common::duration::parse_duration(text)?;
    if duration < Duration::from_secs(1) || duration.subsec_nanos() != 0 {
        return Err(format!("{text:?}: give whole seconds, at least 1s"));
    }
    Ok(duration)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The mirror's state as `status` reports it, shared between the mirror and the server,
/// with the host lease of its last connection (revoked when the daemon stops).
#[derive(Debug, Clone)]
pub struct ClusterView(Arc<Mutex<(ClusterStatus, Option<i64>)>>);

impl ClusterView {
    pub(crate) fn new(config: &FleetConfig) -> ClusterView {
        ClusterView(Arc::new(Mutex::new((
            ClusterStatus {
                connected: false,
                endpoints: config.endpoints.clone(),
                prefix: config.prefix.clone(),
                host_id: config.host_id.clone(),
                since_ms: now_ms(),
                mirrored_seq: None,
                behind: 0,
                error: Some("not connected yet".into()),
            },
            None,
        ))))
    }

    /// What `status` says, `head` being the newest seq committed here.
    pub(crate) fn status(&self, head: u64) -> ClusterStatus {
        let mut status = self.0.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
        status.behind = head.saturating_sub(status.mirrored_seq.unwrap_or(0));
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_and_prefixes_are_single_clean_segments() {
        assert_eq!(parse_host_id("build-7.eu_1"), Ok("build-7.eu_1".into()));
        for bad in ["", "a/b", "..\u{1b}[2J", "a b", &"x".repeat(129)] {
            assert!(parse_host_id(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_prefix("/liveness/prod"), Ok("/liveness/prod".into()));
        for bad in ["liveness", "/liveness/", "/a b", "/a\nb", ""] {
            assert!(parse_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_lock_name_is_one_key_segment() {
        assert_eq!(lock_segment("build"), "build");
        assert_eq!(lock_segment("a/b"), "a%2Fb");
        assert_eq!(lock_segment("a%2Fb"), "a%252Fb");
        assert_eq!(lock_segment("../x"), "..%2Fx");
    }

    #[test]
    fn ttls_are_whole_seconds() {
        assert_eq!(parse_ttl("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_ttl("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["0s", "500ms", "1500ms"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
