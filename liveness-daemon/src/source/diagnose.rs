//! Why a system call an exit source needs fails here, found by probing rather than guessed
//! from an error code: ENOSYS means "not in this kernel" only when no seccomp filter could
//! have returned it, and EPERM means "not privileged" only when capabilities are missing.
//!
//! The facts read are the kernel release, the calling thread's seccomp mode and filter count
//! and its effective capabilities (`/proc/thread-self/status`: credentials and filters belong
//! to threads), plus one harmless call of the syscall with arguments the kernel rejects with
//! EINVAL before doing anything: that error proves the call reached the kernel.

use std::fmt;
use std::io;

use serde::Serialize;

/// A kernel version, major and minor (`6.18.0-1-cloud-amd64` is 6.18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
}

impl Release {
    pub const fn new(major: u32, minor: u32) -> Release {
        Release { major, minor }
    }

    /// The version at the start of a `uname -r` string.
    pub fn parse(text: &str) -> Option<Release> {
        let mut numbers = text
            .split(|c: char| !c.is_ascii_digit())
            .map(|part| part.parse().ok());
        Some(Release::new(numbers.next()??, numbers.next()??))
    }

    /// The running kernel's.
    pub fn running() -> Option<Release> {
        Release::parse(&rustix::system::uname().release().to_string_lossy())
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A capability an exit source may need (numbers of `include/uapi/linux/capability.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    SysAdmin = 21,
    Perfmon = 38,
    Bpf = 39,
}

impl Capability {
    fn name(self) -> &'static str {
        match self {
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::Perfmon => "CAP_PERFMON",
            Capability::Bpf => "CAP_BPF",
        }
    }
}

/// What this thread is allowed, as `/proc/thread-self/status` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restrictions {
    /// `Seccomp:`: 0 none, 1 strict, 2 filter.
    pub seccomp_mode: u8,
    /// `Seccomp_filters:` (Linux 5.9+): how many filters are stacked on this thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp_filters: Option<u32>,
    /// `CapEff:` as a bit mask.
    #[serde(skip)]
    effective: u64,
    /// The capabilities of [`Capability`] that are effective, by name.
    pub capabilities: Vec<&'static str>,
}

impl Restrictions {
    /// This thread's restrictions. A `/proc` that cannot be read counts as unrestricted
    /// with no capabilities: the diagnosis then blames nothing it cannot see.
    pub fn of_this_thread() -> Restrictions {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        Restrictions::parse(&status)
    }

    fn parse(status: &str) -> Restrictions {
        let field = |name: &str| {
            status.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key == name).then(|| value.trim())
            })
        };
        let effective = field("CapEff")
            .and_then(|mask| u64::from_str_radix(mask, 16).ok())
            .unwrap_or(0);
        let mut restrictions = Restrictions {
            seccomp_mode: field("Seccomp").and_then(|m| m.parse().ok()).unwrap_or(0),
            seccomp_filters: field("Seccomp_filters").and_then(|n| n.parse().ok()),
            effective,
            capabilities: Vec::new(),
        };
        restrictions.capabilities = [Capability::Bpf, Capability::Perfmon, Capability::SysAdmin]
            .into_iter()
            .filter(|&cap| restrictions.has(cap))
            .map(Capability::name)
            .collect();
        restrictions
    }

    fn has(&self, capability: Capability) -> bool {
        self.effective & (1 << capability as u32) != 0
    }

    /// Those of `needed` this thread lacks; CAP_SYS_ADMIN stands in for CAP_BPF and
    /// CAP_PERFMON, as in the kernel's `bpf_capable()` and `perfmon_capable()`.
    fn missing(&self, needed: &[Capability]) -> Vec<Capability> {
        if self.has(Capability::SysAdmin) {
            return Vec::new();
        }
        needed.iter().copied().filter(|&c| !self.has(c)).collect()
    }
}

/// A system call an exit source needs, and how to probe it harmlessly.
#[derive(Debug)]
pub struct Syscall {
    pub name: &'static str,
    /// The release that added it.
    pub since: Release,
    /// The kernel option that builds it in, if it is optional.
    pub config: Option<&'static str>,
    /// Capabilities it needs (beyond what any process has).
    pub needs: &'static [Capability],
    /// Calls it so that a kernel that has it fails with EINVAL and changes nothing.
    probe: fn() -> io::Error,
}

/// `bpf(2)` as the eBPF source uses it: maps, a tracing program, a ring buffer.
pub const BPF: Syscall = Syscall {
    name: "bpf",
    since: Release::new(3, 18),
    config: Some("CONFIG_BPF_SYSCALL"),
    needs: &[Capability::Bpf, Capability::Perfmon],
    probe: || {
        // No command has this number; `attr` is empty, so nothing is read.
        // SAFETY: a null attribute pointer with size 0 is never dereferenced.
        unsafe { libc::syscall(libc::SYS_bpf, libc::c_int::MAX, std::ptr::null::<u8>(), 0) };
        io::Error::last_os_error()
    },
};

/// `pidfd_open(2)`.
pub const PIDFD_OPEN: Syscall = Syscall {
    name: "pidfd_open",
    since: Release::new(5, 3),
    config: None,
    needs: &[],
    probe: || {
        // Every flag bit set: the kernel rejects unknown flags before looking at the PID.
        // SAFETY: plain integers; on the impossible success the fd is closed at once.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), libc::c_uint::MAX) };
        let error = io::Error::last_os_error();
        if fd >= 0 {
            // SAFETY: a descriptor this probe just opened and nothing else knows.
            unsafe { libc::close(fd as libc::c_int) };
        }
        error
    },
};

/// Why a system call fails here, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error(
        "a seccomp filter on this process blocks {syscall}(2) (it fails with {errno} on Linux \
         {release}, which has it; seccomp mode {mode}, {filters} filter(s)): run it without \
         that filter, or allow {syscall} in it (a container's seccomp profile, systemd's \
         SystemCallFilter=)"
    )]
    Seccomp {
        syscall: &'static str,
        errno: Errno,
        /// The running release, or a stand-in when unknown.
        release: String,
        mode: u8,
        /// `Seccomp_filters:`, which kernels before 5.9 do not show.
        filters: String,
    },
    #[error(
        "{syscall}(2) does not exist on Linux {release}: it came with Linux {since}; boot a \
         newer kernel"
    )]
    KernelTooOld {
        syscall: &'static str,
        release: Release,
        since: Release,
    },
    #[error(
        "{syscall}(2) fails with ENOSYS on Linux {release} and no seccomp filter is in the \
         way: the kernel lacks it{built_without} (or a sandbox that emulates Linux, such as \
         gVisor, does); boot a kernel that has it"
    )]
    NotBuiltIn {
        syscall: &'static str,
        release: String,
        /// ` (built without CONFIG_...)` where the syscall is optional, else empty.
        built_without: String,
    },
    #[error(
        "{syscall}(2) needs {missing} (or CAP_SYS_ADMIN), which this process lacks: run it as \
         root or grant them (systemd: AmbientCapabilities=)"
    )]
    Privileges {
        syscall: &'static str,
        missing: CapabilityList,
    },
    #[error(
        "{syscall}(2) fails with {errno} although the kernel has it, no seccomp filter blocks \
         it and this process has the capabilities it needs: a security module (SELinux, \
         AppArmor, BPF LSM) or kernel lockdown refuses it; see the kernel log"
    )]
    Refused { syscall: &'static str, errno: Errno },
}

/// Probes `syscall` and says why a call of it failed with `error`, or `None` when the
/// failure is not about the syscall being unavailable (a bad argument, say) and the caller's
/// own reading of `error` stands.
pub fn explain(syscall: &Syscall, error: Option<i32>) -> Option<Denial> {
    let probe = (syscall.probe)().raw_os_error();
    classify(
        syscall,
        Probe::from_errno(probe),
        error,
        Release::running(),
        &Restrictions::of_this_thread(),
    )
}

/// What the harmless call of a syscall returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// EINVAL: the call reached the kernel's own argument checks.
    Reached,
    /// Anything else: something stopped it first (or the kernel lacks it).
    Stopped(i32),
}

impl Probe {
    fn from_errno(errno: Option<i32>) -> Probe {
        match errno {
            Some(libc::EINVAL) => Probe::Reached,
            other => Probe::Stopped(other.unwrap_or(0)),
        }
    }
}

fn classify(
    syscall: &Syscall,
    probe: Probe,
    error: Option<i32>,
    release: Option<Release>,
    restrictions: &Restrictions,
) -> Option<Denial> {
    let missing = restrictions.missing(syscall.needs);
    let privileges = || Denial::Privileges {
        syscall: syscall.name,
        missing: CapabilityList(missing.clone()),
    };
    match probe {
        // Not EACCES: the verifier rejects a program with it, which is no denial.
        Probe::Reached if error == Some(libc::EPERM) => Some(if missing.is_empty() {
            Denial::Refused {
                syscall: syscall.name,
                errno: Errno(libc::EPERM),
            }
        } else {
            privileges()
        }),
        Probe::Reached => None,
        Probe::Stopped(_) if release.is_some_and(|r| r < syscall.since) => {
            Some(Denial::KernelTooOld {
                syscall: syscall.name,
                release: release.unwrap_or(syscall.since),
                since: syscall.since,
            })
        }
        Probe::Stopped(errno) if restrictions.seccomp_mode != 0 => Some(Denial::Seccomp {
            syscall: syscall.name,
            errno: Errno(errno),
            release: release_text(release),
            mode: restrictions.seccomp_mode,
            filters: restrictions
                .seccomp_filters
                .map_or_else(|| "an unknown number of".into(), |n| n.to_string()),
        }),
        Probe::Stopped(libc::ENOSYS) => Some(Denial::NotBuiltIn {
            syscall: syscall.name,
            release: release_text(release),
            built_without: syscall
                .config
                .map(|option| format!(" (built without {option})"))
                .unwrap_or_default(),
        }),
        // Linux before 6.5 refuses every bpf command up front without CAP_BPF when
        // unprivileged eBPF is disabled.
        Probe::Stopped(libc::EPERM | libc::EACCES) if !missing.is_empty() => Some(privileges()),
        Probe::Stopped(errno) => Some(Denial::Refused {
            syscall: syscall.name,
            errno: Errno(errno),
        }),
    }
}

fn release_text(release: Option<Release>) -> String {
    release.map_or_else(|| "(unknown release)".into(), |r| r.to_string())
}

/// An error number shown by its name where it is one a denial is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            libc::ENOSYS => f.write_str("ENOSYS"),
            libc::EPERM => f.write_str("EPERM"),
            libc::EACCES => f.write_str("EACCES"),
            libc::EINVAL => f.write_str("EINVAL"),
            other => write!(f, "errno {other}"),
        }
    }
}

/// Capability names joined by "and".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityList(pub Vec<Capability>);

impl fmt::Display for CapabilityList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|c| c.name()).collect();
        f.write_str(&names.join(" and "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str =
        "Name:\tlivenessd\nCapEff:\t000001ffffffffff\nSeccomp:\t0\nSeccomp_filters:\t0\n";
    const FILTERED: &str = "CapEff:\t000001ffffffffff\nSeccomp:\t2\nSeccomp_filters:\t1\n";
    const NOBODY: &str = "CapEff:\t0000000000000000\nSeccomp:\t0\nSeccomp_filters:\t0\n";
    /// CAP_BPF and CAP_PERFMON without CAP_SYS_ADMIN.
    const BPF_ONLY: &str = "CapEff:\t000000c000000000\nSeccomp:\t0\n";

    fn classify_on(
        syscall: &Syscall,
        probe: Probe,
        error: i32,
        release: (u32, u32),
        status: &str,
    ) -> Option<Denial> {
        classify(
            syscall,
            probe,
            Some(error),
            Some(Release::new(release.0, release.1)),
            &Restrictions::parse(status),
        )
    }

    #[test]
    fn releases_parse_from_uname() {
        assert_eq!(
            Release::parse("5.10.0-46-cloud-amd64"),
            Some(Release::new(5, 10))
        );
        assert_eq!(Release::parse("6.18.0"), Some(Release::new(6, 18)));
        assert_eq!(Release::parse("6.1"), Some(Release::new(6, 1)));
        assert_eq!(Release::parse("linux"), None);
        assert!(Release::new(5, 10) < Release::new(6, 1));
        assert!(Release::new(6, 9) < Release::new(6, 12));
    }

    #[test]
    fn status_fields_are_read() {
        let filtered = Restrictions::parse(FILTERED);
        assert_eq!(filtered.seccomp_mode, 2);
        assert_eq!(filtered.seccomp_filters, Some(1));
        assert_eq!(
            filtered.capabilities,
            ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"]
        );
        let old = Restrictions::parse("Seccomp:\t2\n");
        assert_eq!(old.seccomp_filters, None, "5.8 has no Seccomp_filters line");
        assert!(Restrictions::parse(NOBODY).capabilities.is_empty());
        assert_eq!(
            Restrictions::parse(BPF_ONLY).capabilities,
            ["CAP_BPF", "CAP_PERFMON"]
        );
    }

    #[test]
    fn a_filtered_syscall_is_not_called_missing() {
        for errno in [libc::ENOSYS, libc::EPERM] {
            let denial = classify_on(&PIDFD_OPEN, Probe::Stopped(errno), errno, (6, 18), FILTERED);
            let Some(denial @ Denial::Seccomp { .. }) = denial else {
                panic!("errno {errno} under a filter on 6.18: expected Seccomp, got {denial:?}");
            };
            let text = denial.to_string();
            assert!(text.contains("seccomp filter"), "{text}");
            assert!(!text.contains("older"), "{text}");
        }
    }

    #[test]
    fn a_syscall_newer_than_the_kernel_is_called_missing_even_under_a_filter() {
        for status in [ROOT, FILTERED] {
            let denial = classify_on(
                &PIDFD_OPEN,
                Probe::Stopped(libc::ENOSYS),
                libc::ENOSYS,
                (5, 2),
                status,
            );
            assert_eq!(
                denial,
                Some(Denial::KernelTooOld {
                    syscall: "pidfd_open",
                    release: Release::new(5, 2),
                    since: Release::new(5, 3),
                })
            );
        }
    }

    #[test]
    fn enosys_without_a_filter_on_a_new_kernel_is_a_missing_build_option() {
        let denial = classify_on(
            &BPF,
            Probe::Stopped(libc::ENOSYS),
            libc::ENOSYS,
            (6, 1),
            ROOT,
        );
        assert!(
            matches!(
                denial,
                Some(Denial::NotBuiltIn { ref built_without, .. })
                    if built_without.contains("CONFIG_BPF_SYSCALL")
            ),
            "{denial:?}"
        );
    }

    #[test]
    fn eperm_without_capabilities_names_the_missing_ones() {
        // 6.5+ lets the probe through and refuses the real call.
        let reached = classify_on(&BPF, Probe::Reached, libc::EPERM, (6, 18), NOBODY);
        // Before 6.5 the probe itself is refused.
        let stopped = classify_on(
            &BPF,
            Probe::Stopped(libc::EPERM),
            libc::EPERM,
            (5, 10),
            NOBODY,
        );
        for denial in [reached, stopped] {
            let text = denial.as_ref().map(ToString::to_string).unwrap_or_default();
            assert!(
                matches!(denial, Some(Denial::Privileges { .. }))
                    && text.contains("CAP_BPF and CAP_PERFMON"),
                "{denial:?}: {text}"
            );
        }
        // CAP_SYS_ADMIN covers both; with it, EPERM is someone else's refusal.
        let admin = classify_on(&BPF, Probe::Reached, libc::EPERM, (6, 18), ROOT);
        assert!(matches!(admin, Some(Denial::Refused { .. })), "{admin:?}");
        let bpf_only = classify_on(&BPF, Probe::Reached, libc::EPERM, (6, 18), BPF_ONLY);
        assert!(
            matches!(bpf_only, Some(Denial::Refused { .. })),
            "{bpf_only:?}"
        );
    }

    #[test]
    fn other_failures_of_a_reachable_syscall_are_left_to_the_caller() {
        assert_eq!(
            classify_on(&BPF, Probe::Reached, libc::EINVAL, (5, 4), ROOT),
            None
        );
        assert_eq!(
            classify_on(&BPF, Probe::Reached, libc::EACCES, (6, 12), ROOT),
            None,
            "the verifier's EACCES is the program's fault, not a denial"
        );
        assert_eq!(
            classify(&BPF, Probe::Reached, None, None, &Restrictions::parse(ROOT)),
            None
        );
    }

    #[test]
    fn the_probes_reach_this_kernel() {
        // Whatever runs these tests has both syscalls and no filter against them, unless it
        // is itself filtered: then the diagnosis must say so.
        let restrictions = Restrictions::of_this_thread();
        for syscall in [&BPF, &PIDFD_OPEN] {
            let probe = Probe::from_errno((syscall.probe)().raw_os_error());
            if restrictions.seccomp_mode == 0 && Release::running() >= Some(Release::new(5, 3)) {
                // Unprivileged bpf on kernels before 6.5 is stopped with EPERM.
                let unprivileged_bpf =
                    syscall.name == "bpf" && !restrictions.missing(BPF.needs).is_empty();
                assert!(
                    probe == Probe::Reached || unprivileged_bpf,
                    "{}: {probe:?}",
                    syscall.name
                );
            }
        }
    }
}
