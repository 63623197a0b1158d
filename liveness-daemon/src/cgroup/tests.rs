//! Detection against crafted mountinfo files and cgroup trees in a temporary directory.

use std::fs;

use super::*;

/// A mountinfo file naming `mount` as a cgroup2 mount (with `root` and `options`), after
/// a v1 memory mount.
fn mountinfo(dir: &Path, mount: &Path, root: &str, options: &str) -> PathBuf {
    let path = dir.join("mountinfo");
    fs::write(
        &path,
        format!(
            "35 33 0:30 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n\
             34 33 0:29 {root} {} {options} shared:10 - cgroup2 cgroup2 rw,nsdelegate\n",
            mount.display()
        ),
    )
    .unwrap();
    path
}

/// Detection on a host where systemd is not the init: the daemon writes the cgroups.
fn detect(mountinfo: &Path) -> Support {
    Support::detect(mountinfo, Err("systemd is not the init".into()))
}

/// A directory standing for a cgroup2 mount whose root offers `controllers`.
fn mount_with(dir: &Path, controllers: &str) -> PathBuf {
    let mount = dir.join("cg");
    fs::create_dir(&mount).unwrap();
    fs::write(mount.join("cgroup.controllers"), controllers).unwrap();
    fs::write(mount.join("cgroup.subtree_control"), "").unwrap();
    mount
}

#[test]
fn hybrid_host_is_unusable_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let mount = mount_with(dir.path(), "hugetlb\n");
    let support = detect(&mountinfo(dir.path(), &mount, "/", "rw"));
    let status = support.status();
    assert!(!status.usable);
    assert_eq!(status.mount, Some(mount.display().to_string()));
    assert_eq!(status.controllers, ["hugetlb"]);
    let reason = status.reason.unwrap();
    assert!(reason.contains("no memory or pids controller"), "{reason}");
    assert!(reason.contains("offers hugetlb"), "{reason}");
    assert!(support.unusable_warning().unwrap().contains(&reason));
    // Nothing was created on a host that cannot use it.
    assert!(!mount.join(SUBTREE).exists());
}

#[test]
fn unified_host_gets_the_subtree_with_its_controllers_enabled_at_the_first_cgroup_only() {
    let dir = tempfile::tempdir().unwrap();
    let mount = mount_with(dir.path(), "cpuset cpu io memory hugetlb pids rdma misc\n");
    // A kernel of 5.19+ shows these in every non-root cgroup (here one of another's).
    fs::create_dir(mount.join("system.slice")).unwrap();
    fs::write(mount.join("system.slice").join("cgroup.kill"), "").unwrap();
    fs::write(mount.join("system.slice").join("memory.peak"), "0\n").unwrap();
    let support = detect(&mountinfo(dir.path(), &mount, "/", "rw,nosuid"));
    let Support::Usable(hierarchy) = &support else {
        panic!("{support:?}");
    };
    assert_eq!(hierarchy.subtree, mount.join(SUBTREE));
    assert_eq!(hierarchy.controllers, ["memory", "pids", "cpu", "io"]);
    assert!(hierarchy.kill && hierarchy.peak);
    assert_eq!(support.status().termination, Some(CgroupTermination::Kill));
    // Detection writes nothing: a host whose sessions ask for no cgroup is never touched.
    assert!(!hierarchy.subtree.exists());
    assert_eq!(
        fs::read_to_string(mount.join("cgroup.subtree_control")).unwrap(),
        ""
    );
    assert_eq!(hierarchy.children().unwrap(), Vec::<PathBuf>::new());
    hierarchy.create("s0-1", &Limits::default()).unwrap();
    for dir in [&mount, &hierarchy.subtree] {
        let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap();
        assert_eq!(enabled, "+memory +pids +cpu +io");
    }
    assert_eq!(
        hierarchy.children().unwrap(),
        [hierarchy.subtree.join("s0-1")]
    );
    assert_eq!(support.unusable_warning(), None);
    assert!(support.status().usable && support.status().reason.is_none());
}

#[test]
fn old_kernel_without_kill_or_peak_is_usable_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mount = mount_with(dir.path(), "memory pids\n");
    fs::create_dir(mount.join(SUBTREE)).unwrap();
    let status = detect(&mountinfo(dir.path(), &mount, "/", "rw")).status();
    assert!(status.usable);
    assert_eq!(status.controllers, ["memory", "pids"]);
    assert!(!status.kill && !status.peak);
    // Before 5.2 nothing kills a cgroup at once; 5.2 to 5.13 freeze it instead.
    assert_eq!(status.termination, Some(CgroupTermination::Signals));
    fs::write(mount.join(SUBTREE).join("cgroup.freeze"), "0\n").unwrap();
    let status = detect(&mountinfo(dir.path(), &mount, "/", "rw")).status();
    assert_eq!(status.termination, Some(CgroupTermination::Freeze));
    fs::create_dir(dir.path().join("v1")).unwrap();
    let unusable = mount_with(&dir.path().join("v1"), "hugetlb\n");
    let status = detect(&mountinfo(dir.path(), &unusable, "/", "rw")).status();
    assert_eq!(status.termination, None);
}

#[test]
fn no_cgroup2_mount_read_only_mount_or_damaged_mountinfo() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none");
    fs::write(&none, "25 30 0:23 / /sys rw - sysfs sysfs rw\n").unwrap();
    let reason = detect(&none).status().reason.unwrap();
    assert!(
        reason.starts_with("no cgroup2 file system is mounted"),
        "{reason}"
    );

    let mount = mount_with(dir.path(), "memory pids\n");
    let status = detect(&mountinfo(dir.path(), &mount, "/", "ro,nosuid")).status();
    assert!(!status.usable);
    assert!(status.reason.unwrap().contains("read-only"));

    let damaged = dir.path().join("damaged");
    fs::write(&damaged, "garbage\n").unwrap();
    let status = detect(&damaged).status();
    assert_eq!(
        status.reason.as_deref(),
        Some("mountinfo line 1: no ` - ` separator")
    );

    let missing = detect(&dir.path().join("absent")).status();
    assert!(missing.reason.unwrap().starts_with("cannot read"));
}

#[test]
fn a_subtree_that_cannot_be_made_is_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mount = mount_with(dir.path(), "memory pids\n");
    // A file where the subtree should be.
    fs::write(mount.join(SUBTREE), "").unwrap();
    let status = detect(&mountinfo(dir.path(), &mount, "/", "rw")).status();
    assert!(!status.usable);
    assert!(status.reason.unwrap().contains(SUBTREE));
}

#[test]
fn session_cgroups_get_their_limits_and_their_names_are_the_daemons() {
    let dir = tempfile::tempdir().unwrap();
    let mount = mount_with(dir.path(), "memory pids\n");
    let support = detect(&mountinfo(dir.path(), &mount, "/", "rw"));
    let hierarchy = support.hierarchy().unwrap();
    let limits = Limits {
        memory_max: Some(32 << 20),
        tasks_max: Some(64),
        memory_high: Some(24 << 20),
        cpu_weight: Some(50),
        oom_group: true,
    };
    let path = hierarchy.create("s1000-1", &limits).unwrap();
    assert_eq!(path, hierarchy.subtree.join("s1000-1"));
    for (file, value) in [
        ("memory.max", "33554432"),
        ("memory.high", "25165824"),
        ("pids.max", "64"),
        ("cpu.weight", "50"),
        ("memory.oom.group", "1"),
    ] {
        assert_eq!(
            fs::read_to_string(path.join(file)).unwrap(),
            value,
            "{file}"
        );
    }
    // What is not asked for is not written: the kernel's defaults stay.
    let plain = hierarchy.create("s1000-2", &Limits::default()).unwrap();
    assert_eq!(fs::read_dir(&plain).unwrap().count(), 0);
    // The same name twice is refused, not shared.
    assert!(matches!(
        hierarchy.create("s1000-1", &limits),
        Err(CgroupError::Create { .. })
    ));
}

#[test]
fn a_mount_without_children_is_judged_by_the_kernel_release() {
    assert_eq!(release_version("6.12.38+deb13-amd64"), (6, 12));
    assert_eq!(release_version("5.10.0-35-cloud-amd64"), (5, 10));
    assert_eq!(release_version("garbage"), (0, 0));
}

#[test]
fn counters_are_read_and_what_the_kernel_lacks_is_null() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    // A 5.10 cgroup: no memory.peak, no pids.peak, no io.
    fs::write(
        path.join("memory.events"),
        "low 0\nhigh 2\nmax 7\noom 1\noom_kill 1\n",
    )
    .unwrap();
    fs::write(
        path.join("cpu.stat"),
        "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
    )
    .unwrap();
    let old = usage(path);
    assert_eq!(old.memory_peak, None);
    assert_eq!(old.pids_peak, None);
    assert_eq!(old.io, None);
    assert_eq!(old.cpu_usec, Some(123456));
    assert_eq!(
        old.memory_events,
        Some(MemoryEvents {
            high: 2,
            max: 7,
            oom: 1,
            oom_kill: 1
        })
    );
    fs::write(path.join("memory.peak"), "67108864\n").unwrap();
    fs::write(path.join("pids.peak"), "17\n").unwrap();
    fs::write(
        path.join("io.stat"),
        "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
         254:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n",
    )
    .unwrap();
    let new = usage(path);
    assert_eq!(new.memory_peak, Some(64 << 20));
    assert_eq!(new.pids_peak, Some(17));
    assert_eq!(
        new.io,
        Some(IoUsage {
            rbytes: 4097,
            wbytes: 8194,
            rios: 4,
            wios: 6
        })
    );
    // Damaged numbers are nulls, not zeros.
    fs::write(path.join("memory.peak"), "lots\n").unwrap();
    assert_eq!(usage(path).memory_peak, None);
}

#[test]
fn populated_is_read_from_cgroup_events_and_a_removed_cgroup_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s0-1");
    assert!(!populated(&path).unwrap());
    fs::create_dir(&path).unwrap();
    fs::write(path.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    assert!(populated(&path).unwrap());
    fs::write(path.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    assert!(!populated(&path).unwrap());
}

/// The members a registration would move in: those not in the cgroup already, and for a
/// user only processes of hers (pid 1 and this test's processes are root's).
#[test]
fn strays_are_the_members_outside_that_the_user_may_move() {
    let dir = tempfile::tempdir().unwrap();
    let proc = ProcRoot::default();
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let members: Vec<Identity> = [1, std::process::id(), child.id()]
        .into_iter()
        .map(|pid| proc.capture(pid).unwrap())
        .collect();
    fs::write(dir.path().join("cgroup.procs"), format!("{}\n", child.id())).unwrap();
    let enclosure = |uid| Enclosure {
        path: dir.path().to_path_buf(),
        systemd: None,
        uid,
    };
    let outside: Vec<u32> = [1, std::process::id()].into();
    let strays = enclosure(None).strays(members.clone(), &proc).unwrap();
    assert_eq!(strays.iter().map(|k| k.pid).collect::<Vec<_>>(), outside);
    let theirs = rustix::process::getuid().as_raw();
    let strays = enclosure(Some(theirs + 1)).strays(members.clone(), &proc);
    assert_eq!(strays.unwrap(), vec![]);
    let missing = Enclosure {
        path: dir.path().join("gone"),
        ..enclosure(None)
    };
    assert!(missing.strays(members, &proc).is_err());
    child.kill().unwrap();
    child.wait().unwrap();
}

/// What a cgroup and the cgroups below it hold besides the listed survivors: counted, and
/// named by key while they exist; the survivors are told apart by pid.
#[test]
fn unlisted_are_the_cgroups_processes_that_the_survivors_do_not_list() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = dir.path().join("s1");
    fs::create_dir_all(cgroup.join("below")).unwrap();
    fs::write(cgroup.join("cgroup.procs"), "12\n10\n11\n").unwrap();
    // 13 is gone by the time it is read: counted, not named.
    fs::write(cgroup.join("below/cgroup.procs"), "13\n").unwrap();
    let proc = liveness_proc::fake::FakeProc::new()
        .with(10, "sh", 1)
        .with(11, "sleep", 10)
        .with(12, "joiner", 1);
    let survivor = ProcessKey {
        pid: 11,
        start_ticks: 1011,
    };
    let found = unlisted(&cgroup, &[survivor], &proc.root()).unwrap();
    let key = |pid: u32| ProcessKey {
        pid,
        start_ticks: 1000 + u64::from(pid),
    };
    assert_eq!(found.total, 3);
    assert_eq!(found.processes, [key(10), key(12)]);
    // Every process listed: none. A cgroup gone: none.
    let all = [key(10), survivor, key(12), key(13)];
    assert_eq!(unlisted(&cgroup, &all, &proc.root()), None);
    assert_eq!(unlisted(&dir.path().join("gone"), &[], &proc.root()), None);
    // A crowd: all counted, the lowest pids named.
    let crowd = dir.path().join("s2");
    fs::create_dir_all(&crowd).unwrap();
    let pids: Vec<u32> = (100..100 + MAX_UNLISTED_NAMED as u32 + 6).collect();
    let text: String = pids.iter().rev().map(|pid| format!("{pid}\n")).collect();
    fs::write(crowd.join("cgroup.procs"), text).unwrap();
    let proc = (pids.iter()).fold(proc, |proc, &pid| proc.with(pid, "fork", 1));
    let found = unlisted(&crowd, &[], &proc.root()).unwrap();
    assert_eq!(found.total as usize, MAX_UNLISTED_NAMED + 6);
    let named: Vec<ProcessKey> = pids[..MAX_UNLISTED_NAMED].iter().map(|&p| key(p)).collect();
    assert_eq!(found.processes, named);
}
