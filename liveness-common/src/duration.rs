//! Durations as the command lines of the daemon and the CLI spell them.

use std::time::Duration;

/// The longest duration a flag accepts: anything longer is a typo, and would overflow
/// the timers it sets.
const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// Parses durations such as `250ms`, `30s`, `2m`, `1h`, `7d`: at least 1ms, at most a year.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 2m, 1h, 7d"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?} has no unit: use ms, s, m, h or d")),
    };
    let duration = Duration::from_millis(number.saturating_mul(millis));
    if duration.is_zero() {
        return Err(format!("{text:?} is zero: give at least 1ms"));
    }
    if duration > MAX_DURATION {
        return Err(format!("{text:?} is longer than a year, the most allowed"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("h").unwrap_err().contains("not a duration"));
        assert!(parse_duration("5 weeks").is_err());
    }

    #[test]
    fn zero_and_absurd_durations_are_refused() {
        for zero in ["0ms", "0s", "0d"] {
            assert!(parse_duration(zero).unwrap_err().contains("zero"), "{zero}");
        }
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_duration("366d"), Ok(MAX_DURATION));
        for absurd in ["367d", "99999999999999999999d", "18446744073709551615ms"] {
            assert!(parse_duration(absurd).is_err(), "{absurd}");
        }
    }
}
