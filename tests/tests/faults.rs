//! Fault injection: what the daemon does when its disk fills up.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::{Conn, Daemon, Orphan, eventually, privileged};
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(1500);

/// A small tmpfs, mounted for the test's life (root only), so the disk can be filled
/// without touching the host's.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("size={size},mode=0700")).unwrap();
        // SAFETY: all pointers are NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        SmallFs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the file system is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // Whatever is left is less than one page: nothing more fits.
        let _ = file.write_all(&[0u8; 4096]);
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: detaching the mount this struct made.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn status(conn: &mut Conn) -> Value {
    let reply = conn.request(json!({"op": "status"}));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["status"].clone()
}

/// An owner dies while the database cannot grow: nothing is announced that was not
/// committed, the session stays ACTIVE, and once space is back the death is committed and
/// published exactly once, without a restart.
#[test]
fn a_death_on_a_full_disk_is_committed_once_space_returns() {
    if !privileged("a_death_on_a_full_disk_is_committed_once_space_returns") {
        return;
    }
    let fs = SmallFs::mount("4m");
    // eBPF reports the exit status of a process that is not the daemon's child.
    let daemon = Daemon::start_with_state(Some(fs.path().join("state")), &["--sources", "ebpf"]);
    let mut control = daemon.connect();
    let mut stream = daemon.connect();
    assert_eq!(stream.request(json!({"op": "subscribe"}))["ok"], true);
    let mut owner = Orphan::spawn(&["exit", "3"]);
    let reply =
        control.request(json!({"op": "register", "session": "full", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    let registered = stream.next_within(ARRIVAL).expect("the registration event");
    assert_eq!(registered["event"]["kind"], "session.registered");

    let filler = fs.fill();
    owner.release();
    assert!(
        eventually(ARRIVAL, || status(&mut control)["uncommitted_deaths"] == 1),
        "the death was not held back: {}",
        status(&mut control)
    );
    assert!(
        stream.next_within(QUIET).is_none(),
        "an event was published that could not be committed"
    );
    let session = control.request(json!({"op": "get", "session": "full"}));
    assert_eq!(session["session"]["phase"], "active", "{session}");

    std::fs::remove_file(filler).expect("free the space");
    let ended = stream
        .next_within(ARRIVAL)
        .expect("the death is committed once space returns");
    assert_eq!(ended["event"]["kind"], "session.ended", "{ended}");
    assert_eq!(ended["event"]["reason"], "owner_exited", "{ended}");
    assert_eq!(ended["event"]["exit"], json!({"kind": "exited", "code": 3}));
    assert_ne!(ended["event"]["detected_by"], "reconcile", "{ended}");
    assert!(
        stream.next_within(QUIET).is_none(),
        "the session ended more than once"
    );
    let after = status(&mut control);
    assert_eq!(after["uncommitted_deaths"], 0, "{after}");
    assert!(
        after["counters"]["failed_commits"].as_u64() >= Some(1),
        "{after}"
    );
    let session = control.request(json!({"op": "get", "session": "full"}));
    assert_eq!(session["session"]["phase"], "ended", "{session}");
}
