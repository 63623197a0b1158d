//! What `/proc` says about namespaces, parsed: the reader's boottime offset (time
//! namespaces), a process's pids in nested PID namespaces (`NSpid:`), and what a pidfd's
//! fdinfo names (`Pid:`, `NSpid:`, `ino:`).
//!
//! Only parsing lives here; [`crate::identity::ProcRoot`] reads the files.

/// Nanoseconds per clock tick of `/proc/<pid>/stat` field 22 (USER_HZ is 100 on Linux).
pub const NANOS_PER_TICK: i64 = 10_000_000;

/// How start times read in the reader's time namespace relate to the kernel's.
///
/// `/proc/<pid>/stat` field 22 is `floor((start_boottime + offset) / tick)`, with the
/// boottime offset of the *reader's* time namespace; `start_boottime` itself, which the
/// kernel (and the eBPF program) sees, has no offset. Subtracting the offset makes a start
/// time mean the same in every time namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BoottimeOffset {
    pub nanos: i64,
}

impl BoottimeOffset {
    /// Parses `/proc/self/timens_offsets` (`boottime SECS NSECS`, one clock per line).
    /// A file without a `boottime` line has no offset for it.
    pub fn parse(text: &str) -> Result<BoottimeOffset, &'static str> {
        for line in text.lines() {
            let mut fields = line.split_ascii_whitespace();
            if fields.next() != Some("boottime") {
                continue;
            }
            let secs: i64 = fields
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or("boottime seconds are not a number")?;
            let nanos: i64 = fields
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or("boottime nanoseconds are not a number")?;
            let total = secs
                .checked_mul(1_000_000_000)
                .and_then(|s| s.checked_add(nanos))
                .ok_or("boottime offset out of range")?;
            return Ok(BoottimeOffset { nanos: total });
        }
        Ok(BoottimeOffset::default())
    }

    /// Whether start times read here convert exactly. With an offset that is not a whole
    /// number of ticks, `floor((t + offset) / tick) - floor(offset / tick)` is the true tick
    /// count or one more, depending on sub-tick parts nobody can read: such a reading is
    /// ambiguous by one tick.
    pub fn is_whole_ticks(&self) -> bool {
        self.nanos.rem_euclid(NANOS_PER_TICK) == 0
    }

    /// A start time read here, as the kernel counts it (the initial time namespace).
    pub fn normalize(&self, ticks_read: u64) -> u64 {
        let offset_ticks = self.nanos.div_euclid(NANOS_PER_TICK);
        (i128::from(ticks_read) - i128::from(offset_ticks)).clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// The `NSpid:` values of a `/proc/<pid>/status` or fdinfo text: the pid in each PID
/// namespace from the reader's (the proc mount's) down to the process's own. Empty when the
/// line is absent (kernels before 4.1) or the process is not visible.
pub fn parse_nspid(text: &str) -> Vec<u32> {
    text.lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map(|values| {
            values
                .split_ascii_whitespace()
                .map_while(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What `/proc/self/fdinfo/<pidfd>` says about the process behind a pidfd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidfdInfo {
    /// The pid in the proc mount's namespace: `None` when the process exited (`-1`) ...
    pub pid: Option<u32>,
    /// ... and `Some(0)` when it is alive but not visible in that namespace.
    pub nspid: Vec<u32>,
}

/// Parses a pidfd's fdinfo. `Err` when it has no `Pid:` line: the fd is not a pidfd.
pub fn parse_pidfd_fdinfo(text: &str) -> Result<PidfdInfo, &'static str> {
    let pid = text
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .ok_or("not a pidfd (no Pid: line in its fdinfo)")?
        .trim();
    let pid = match pid.parse::<i64>() {
        Ok(-1) => None,
        Ok(n) => Some(u32::try_from(n).map_err(|_| "Pid: out of range")?),
        Err(_) => return Err("Pid: is not a number"),
    };
    Ok(PidfdInfo {
        pid,
        nspid: parse_nspid(text),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timens_offsets_parse_and_normalize() {
        let text = "monotonic           0         0\nboottime         1000         0\n";
        let offset = BoottimeOffset::parse(text).unwrap();
        assert_eq!(offset.nanos, 1_000_000_000_000);
        assert!(offset.is_whole_ticks());
        assert_eq!(
            offset.normalize(100_000 + 42),
            42,
            "1000 s are 100000 ticks"
        );

        let negative = BoottimeOffset::parse("boottime -5 0\n").unwrap();
        assert_eq!(negative.normalize(10), 510);

        let fraction = BoottimeOffset::parse("boottime 0 15000000\n").unwrap();
        assert!(!fraction.is_whole_ticks(), "15 ms is a tick and a half");
        assert_eq!(
            fraction.normalize(7),
            6,
            "the true value (5 or 6 here) or one more"
        );
        assert_eq!(
            BoottimeOffset::parse("monotonic 0 0\n").unwrap(),
            BoottimeOffset::default(),
            "no boottime line: no offset"
        );
        assert_eq!(BoottimeOffset::default().normalize(0), 0);
        assert!(BoottimeOffset::parse("boottime x 0\n").is_err());
        assert!(BoottimeOffset::parse("boottime 1\n").is_err());
        assert!(BoottimeOffset::parse("boottime 99999999999999999 0\n").is_err());
    }

    #[test]
    fn nspid_lists_every_level() {
        let status = "Name:\tsleep\nTgid:\t4242\nNSpid:\t4242\t17\t1\nPPid:\t1\n";
        assert_eq!(parse_nspid(status), vec![4242, 17, 1]);
        assert_eq!(parse_nspid("NSpid:\t9\n"), vec![9]);
        assert!(parse_nspid("Name:\tx\n").is_empty(), "old kernels: no line");
    }

    #[test]
    fn pidfd_fdinfo_names_the_process_or_says_it_exited() {
        let live =
            "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1234\nPid:\t4242\nNSpid:\t4242\t17\n";
        assert_eq!(
            parse_pidfd_fdinfo(live).unwrap(),
            PidfdInfo {
                pid: Some(4242),
                nspid: vec![4242, 17]
            }
        );
        let exited = "pos:\t0\nPid:\t-1\nNSpid:\t-1\n";
        assert_eq!(parse_pidfd_fdinfo(exited).unwrap().pid, None);
        let elsewhere = "Pid:\t0\n";
        assert_eq!(parse_pidfd_fdinfo(elsewhere).unwrap().pid, Some(0));
        assert!(parse_pidfd_fdinfo("pos:\t0\nflags:\t0\n").is_err());
        assert!(parse_pidfd_fdinfo("Pid:\tx\n").is_err());
    }
}
