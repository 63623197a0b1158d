//! Times for people: ages ("2 min ago") and local wall-clock times, from the Unix
//! milliseconds the daemon reports.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// When a process of this boot started, in Unix milliseconds, from its start time in
/// clock ticks since boot (`/proc/PID/stat` field 22) and the boot time in `/proc/stat`.
pub(crate) fn process_start_ms(start_ticks: u64) -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot_s: i64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks_per_s = u64::try_from(ticks_per_s).ok().filter(|&t| t > 0)?;
    Some(boot_s * 1000 + (start_ticks * 1000 / ticks_per_s) as i64)
}

/// How long ago `then_ms` was, seen at `now_ms`: "just now", "40 s ago", "2 min ago",
/// "3 h ago", "5 days ago" (or "in 2 min" for a time to come).
pub(crate) fn age(then_ms: i64, now_ms: i64) -> String {
    let delta = now_ms - then_ms;
    if delta.unsigned_abs() < 1000 {
        return "just now".to_owned();
    }
    let amount = span(delta.unsigned_abs());
    if delta >= 0 {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// A length of time as a person says it: "40 s", "2 min", "3 h", "1 day".
pub(crate) fn span(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86_400 => format!("{} h", seconds / 3600),
        _ if seconds / 86_400 == 1 => "1 day".to_owned(),
        _ => format!("{} days", seconds / 86_400),
    }
}

/// `ms` as a local time, "2026-11-23 18:01:02 CET" (UTC where the time zone is unknown).
pub(crate) fn local_time(ms: i64) -> String {
    let seconds = ms.div_euclid(1000) as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value (integers and a null zone name).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the thread-safe variant
    // and writes only into `tm`.
    if unsafe { libc::localtime_r(&seconds, &mut tm) }.is_null() {
        return format!("@{}", ms / 1000);
    }
    let zone = if tm.tm_zone.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null tm_zone points at a NUL-terminated name owned by libc's time
        // zone data, which lives for the process.
        let name = unsafe { std::ffi::CStr::from_ptr(tm.tm_zone) };
        format!(" {}", name.to_string_lossy())
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}{zone}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_a_person_would_say_them() {
        let now = 1_000_000_000_000;
        assert_eq!(age(now, now), "just now");
        assert_eq!(age(now - 40_000, now), "40 s ago");
        assert_eq!(age(now - 150_000, now), "2 min ago");
        assert_eq!(age(now - 3 * 3_600_000, now), "3 h ago");
        assert_eq!(age(now - 86_400_000, now), "1 day ago");
        assert_eq!(age(now - 5 * 86_400_000, now), "5 days ago");
        assert_eq!(age(now + 120_000, now), "in 2 min");
    }

    #[test]
    fn local_times_have_a_date_and_a_time() {
        let text = local_time(1_700_000_000_000);
        assert!(text.starts_with("2023-11-1"), "{text}");
        assert_eq!(text.as_bytes()[10], b' ', "{text}");
    }
}
