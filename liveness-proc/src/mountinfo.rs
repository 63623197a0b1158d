//! The mounts of a mountinfo file (proc(5), `/proc/self/mountinfo`), paths unescaped:
//! where the cgroup hierarchies are, wherever the host mounted them (`/sys/fs/cgroup`,
//! `/sys/fs/cgroup/unified` on a hybrid host, or anywhere else).

use std::path::PathBuf;

/// A line of mountinfo that does not have the fields proc(5) promises.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("mountinfo line {line}: {what}")]
pub struct MountinfoError {
    pub line: usize,
    pub what: &'static str,
}

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted, in this mount namespace.
    pub mount_point: PathBuf,
    /// The directory of its file system that the mount shows as its root: for a cgroup
    /// hierarchy, the cgroup (`/` unless a cgroup namespace or a bind mount of a subtree).
    pub root: String,
    /// The file system's type (`cgroup2`, `cgroup`, `ext4`, ...).
    pub fstype: String,
    /// Mounted read-only: nothing can be created under it.
    pub read_only: bool,
    /// The file system's own options: for a cgroup v1 hierarchy, its controllers.
    pub super_options: Vec<String>,
}

/// Every mount of `text` (the contents of a mountinfo file), in its order.
pub fn mounts(text: &str) -> Result<Vec<Mount>, MountinfoError> {
    let mut mounts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let error = |what| MountinfoError {
            line: index + 1,
            what,
        };
        // `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`
        let (before, after) = line
            .split_once(" - ")
            .ok_or_else(|| error("no ` - ` separator"))?;
        let fields: Vec<&str> = before.split(' ').collect();
        if fields.len() < 6 {
            return Err(error("fewer than six fields before the separator"));
        }
        let mut after = after.split(' ');
        let fstype = after
            .next()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| error("no file system type"))?;
        mounts.push(Mount {
            mount_point: PathBuf::from(unescape(fields[4])),
            root: unescape(fields[3]),
            fstype: fstype.to_owned(),
            read_only: fields[5].split(',').any(|o| o == "ro"),
            super_options: (after.nth(1).unwrap_or_default().split(','))
                .filter(|o| !o.is_empty())
                .map(str::to_owned)
                .collect(),
        });
    }
    Ok(mounts)
}

/// The cgroup2 mounts of `text`, in its order.
pub fn cgroup2_mounts(text: &str) -> Result<Vec<Mount>, MountinfoError> {
    let mut mounts = mounts(text)?;
    mounts.retain(|m| m.fstype == "cgroup2");
    Ok(mounts)
}

/// Mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// This machine's kind: v1 controllers, and cgroup2 at `unified`.
    const HYBRID: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
";

    #[test]
    fn hybrid_host_has_its_cgroup2_at_unified_and_memory_in_v1() {
        assert_eq!(
            cgroup2_mounts(HYBRID).unwrap(),
            vec![Mount {
                mount_point: "/sys/fs/cgroup/unified".into(),
                root: "/".into(),
                fstype: "cgroup2".into(),
                read_only: false,
                super_options: vec!["rw".into(), "nsdelegate".into()],
            }]
        );
        let all = mounts(HYBRID).unwrap();
        assert_eq!(all.len(), 4);
        assert!(all[1].read_only);
        assert_eq!(all[3].fstype, "cgroup");
        assert_eq!(all[3].super_options, ["rw", "memory"]);
    }

    #[test]
    fn a_mount_anywhere_with_escapes_and_no_optional_fields() {
        let text =
            "40 1 0:35 /user.slice /mnt/my\\040cgroups\\134x ro,relatime - cgroup2 none rw\n";
        let mounts = cgroup2_mounts(text).unwrap();
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/my cgroups\\x"));
        assert_eq!(mounts[0].root, "/user.slice");
        assert!(mounts[0].read_only);
    }

    #[test]
    fn no_cgroup2_mount_is_an_empty_list() {
        let text = "25 30 0:23 / /sys rw - sysfs sysfs rw\n\n35 25 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(cgroup2_mounts(text).unwrap(), vec![]);
    }

    #[test]
    fn damaged_lines_are_errors_naming_the_line() {
        assert_eq!(
            mounts("25 30 0:23 / /sys rw sysfs sysfs rw\n"),
            Err(MountinfoError {
                line: 1,
                what: "no ` - ` separator"
            })
        );
        assert_eq!(
            mounts("ok\n1 2 / /x - cgroup2 none rw\n").unwrap_err().line,
            1
        );
        assert!(mounts("1 2 0:1 / /x rw - \n").is_err());
        // A trailing backslash or a short escape is kept as written.
        assert_eq!(unescape("a\\04"), "a\\04");
    }

    #[test]
    fn this_hosts_mountinfo_parses() {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounts = mounts(&text).unwrap();
        assert!(mounts.iter().any(|m| m.mount_point == Path::new("/")));
    }
}
