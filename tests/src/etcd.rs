//! A real etcd on loopback (Debian's `etcd-server`), on free ports and a data directory of
//! its own, and `etcdctl` (`etcd-client`) to read it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::eventually;

/// How long etcd may take to start answering.
const START: Duration = Duration::from_secs(20);

/// An etcd server, killed on drop; stopped, paused and started again on the same data.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    /// `USER:PASSWORD` for etcdctl, once [`Etcd::enable_auth`] turned authentication on.
    user: Option<String>,
    /// Serving TLS only, to clients with a certificate of [`Etcd::tls`]'s CA.
    tls: Option<TlsFiles>,
}

/// A CA, etcd's certificate for 127.0.0.1 and a client's, made by `openssl` for one test.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    /// Mode 600, as the daemon wants a key.
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Makes them in `dir` (EC P-256 keys, valid for a day).
    pub fn make(dir: &std::path::Path) -> TlsFiles {
        let openssl = |args: &[&str]| {
            let output = Command::new("openssl")
                .current_dir(dir)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
            assert!(output.status.success(), "openssl {args:?}: {output:?}");
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let ca = ["-x509", "-days", "1", "-subj", "/CN=liveness test CA"];
        openssl(
            &[
                &["req"][..],
                &ca,
                &key,
                &["-keyout", "ca.key", "-out", "ca.crt"],
            ]
            .concat(),
        );
        for (name, extensions) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            let ext = format!("{name}.ext");
            std::fs::write(dir.join(&ext), extensions).expect("the extensions' file");
            let subject = format!("/CN={name}");
            let (csr, cert, key_file) = (
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.key"),
            );
            let request = ["-subj", &subject, "-keyout", &key_file, "-out", &csr];
            openssl(&[&["req"][..], &key, &request].concat());
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-out",
                &cert,
                "-extfile",
                &ext,
            ]);
        }
        let files = TlsFiles {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&files.client_key, std::fs::Permissions::from_mode(0o600))
            .expect("chmod the client's key");
        files
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Etcd {
    /// Chooses its ports and directory without starting it (see [`Etcd::start`]).
    pub fn new() -> Etcd {
        Etcd {
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
            client_port: free_port(),
            peer_port: free_port(),
            user: None,
            tls: None,
        }
    }

    /// A started one that serves TLS only and wants a client certificate
    /// (`--client-cert-auth`), with the files made by `openssl` ([`TlsFiles`]).
    pub fn started_with_tls() -> Etcd {
        let mut etcd = Etcd::new();
        etcd.tls = Some(TlsFiles::make(etcd.dir.path()));
        etcd.start();
        etcd
    }

    /// The CA and certificates of an etcd started with TLS.
    pub fn tls(&self) -> &TlsFiles {
        self.tls.as_ref().expect("an etcd started with TLS")
    }

    /// A started one.
    pub fn started() -> Etcd {
        let mut etcd = Etcd::new();
        etcd.start();
        etcd
    }

    /// The client URL, for `--etcd`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Starts it (again, on the same data), and waits until it answers.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "etcd runs already");
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd's log");
        let mut etcd = Command::new("etcd");
        if let Some(tls) = &self.tls {
            etcd.arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = etcd
            .args(["--name", "t", "--data-dir"])
            .arg(self.data_dir())
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd (apt-get install etcd-server): {e}"));
        self.child = Some(child);
        let answers = eventually(START, || self.ctl(&["endpoint", "health"]).status.success());
        assert!(answers, "etcd did not start: {}", self.log());
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Kills it (SIGKILL): its clients see connections refused.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP or SIGCONT: a stopped etcd accepts connections and answers nothing.
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("etcd runs");
        // SAFETY: a plain kill(2) of our own child, which has not been reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
    }

    /// Makes `root` a user with `password` and turns authentication on: from then on only
    /// users' requests are served.
    pub fn enable_auth(&mut self, password: &str) {
        let user = format!("root:{password}");
        for args in [&["user", "add", &user][..], &["auth", "enable"]] {
            let output = self.ctl(args);
            assert!(output.status.success(), "etcdctl {args:?}: {output:?}");
        }
        self.user = Some(user);
    }

    /// `etcdctl` with the endpoint and the user, API v3.
    fn etcdctl(&self) -> Command {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.url()]);
        if let Some(user) = &self.user {
            command.args(["--user", user]);
        }
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client_cert)
                .arg("--key")
                .arg(&tls.client_key);
        }
        command
    }

    /// `etcdctl ARGS...`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.etcdctl()
            .args(["--command-timeout", "2s"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run etcdctl (apt-get install etcd-client): {e}"))
    }

    /// Every key under `prefix`, sorted, with its value parsed.
    pub fn get_prefix(&self, prefix: &str) -> Vec<(String, Value)> {
        let output = self.ctl(&["get", "--prefix", prefix]);
        assert!(output.status.success(), "etcdctl get: {output:?}");
        let text = String::from_utf8(output.stdout).expect("UTF-8 keys and values");
        let lines: Vec<&str> = text.lines().collect();
        lines
            .chunks(2)
            .map(|pair| {
                let value = serde_json::from_str(pair[1])
                    .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", pair[0], pair[1]));
                (pair[0].to_owned(), value)
            })
            .collect()
    }

    /// The keys under `prefix`, sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.get_prefix(prefix)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    /// How many keys are under `prefix`, whatever their values.
    pub fn key_count(&self, prefix: &str) -> usize {
        let output = self.ctl(&["get", "--prefix", "--keys-only", prefix]);
        assert!(output.status.success(), "etcdctl get: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines().filter(|line| !line.is_empty()).count()
    }

    /// How often `key` was written since it was created (etcd's `version`), 0 if absent.
    pub fn version(&self, key: &str) -> u64 {
        let output = self.ctl(&["get", key, "-w", "json"]);
        assert!(output.status.success(), "etcdctl get: {output:?}");
        let reply: Value = serde_json::from_slice(&output.stdout).expect("etcdctl's JSON");
        reply["kvs"][0]["version"].as_u64().unwrap_or(0)
    }

    /// Compacts etcd's history up to its present revision: older revisions are gone.
    pub fn compact(&self) {
        let output = self.ctl(&["get", "/", "-w", "json"]);
        assert!(output.status.success(), "etcdctl get: {output:?}");
        let reply: Value = serde_json::from_slice(&output.stdout).expect("etcdctl's JSON");
        let revision = reply["header"]["revision"].as_i64().expect("a revision");
        let output = self.ctl(&["compact", &revision.to_string()]);
        assert!(output.status.success(), "etcdctl compact: {output:?}");
    }

    /// `etcdctl watch --prefix PREFIX`, its output piped.
    pub fn watch(&self, prefix: &str) -> Child {
        self.etcdctl()
            .args(["watch", "--prefix", prefix])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl watch")
    }
}

impl Default for Etcd {
    fn default() -> Etcd {
        Etcd::new()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused etcd is killed all the same; SIGCONT lets it see the SIGKILL at once.
            self.signal(libc::SIGCONT);
        }
        self.stop();
    }
}
