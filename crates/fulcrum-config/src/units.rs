//! The duration (`"500ms"`, `"3s"`) and size (`"16MB"`, `"64kB"`) syntax of config values.
//! Pure string parsing; the error strings name the value, never the key (callers add that).

use std::time::Duration;

const DURATION_UNITS: &str = "us, ms, s, m, h";
const SIZE_UNITS: &str = "B, kB (or KB), MB, GB, TB";

/// Parses a duration: a whole number followed by a unit, optionally separated by spaces.
///
/// Units: `us` (microseconds), `ms`, `s`, `m` (minutes), `h`. Fractions are rejected
/// (write `"1500ms"`, not `"1.5s"`), and so is a bare number: `"5"` could mean anything.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(fulcrum_config::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(fulcrum_config::parse_duration("2m"), Ok(Duration::from_secs(120)));
/// assert!(fulcrum_config::parse_duration("5").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let invalid = |why: String| format!("invalid duration {s:?}: {why}");
    let Some((n, unit)) = split_number(s) else {
        return Err(invalid(format!(
            "expected a whole number and a unit ({DURATION_UNITS}), e.g. \"5s\""
        )));
    };
    let n = n.ok_or_else(|| invalid("too large".into()))?;
    let duration = match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        "" => {
            return Err(invalid(format!(
                "missing unit ({DURATION_UNITS}), e.g. \"{n}s\""
            )))
        }
        u if u.starts_with('.') => {
            return Err(invalid(
                "fractions are not supported; use a smaller unit, e.g. \"1500ms\"".into(),
            ))
        }
        u => {
            return Err(invalid(format!(
                "unknown unit {u:?}, expected one of {DURATION_UNITS}"
            )))
        }
    };
    duration.ok_or_else(|| invalid("too large".into()))
}

/// Parses a size in bytes: a whole number with an optional unit, optionally separated by spaces.
///
/// Units are 1024-based, as in PostgreSQL's settings: `B` = 1, `kB`/`KB`/`KiB` = 1024,
/// `MB`/`MiB` = 1024², `GB`/`GiB` = 1024³, `TB`/`TiB` = 1024⁴. No unit means bytes.
/// Lower-case `mb`/`gb` are rejected rather than guessed at.
///
/// ```
/// assert_eq!(fulcrum_config::parse_size("64kB"), Ok(64 * 1024));
/// assert_eq!(fulcrum_config::parse_size("16MB"), Ok(16 * 1024 * 1024));
/// assert_eq!(fulcrum_config::parse_size("512"), Ok(512));
/// ```
pub fn parse_size(s: &str) -> Result<u64, String> {
    let invalid = |why: String| format!("invalid size {s:?}: {why}");
    let Some((n, unit)) = split_number(s) else {
        return Err(invalid(format!(
            "expected a whole number and an optional unit ({SIZE_UNITS}), e.g. \"16MB\""
        )));
    };
    let n = n.ok_or_else(|| invalid("too large".into()))?;
    let shift = match unit {
        "" | "B" => 0,
        "kB" | "KB" | "KiB" => 10,
        "MB" | "MiB" => 20,
        "GB" | "GiB" => 30,
        "TB" | "TiB" => 40,
        u if u.starts_with('.') => {
            return Err(invalid(
                "fractions are not supported; use a smaller unit, e.g. \"1536kB\"".into(),
            ))
        }
        u => {
            return Err(invalid(format!(
                "unknown unit {u:?}, expected one of {SIZE_UNITS} (1024-based)"
            )))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| invalid("too large".into()))
}

/// Splits `" 15 ms "` into `(Some(15), "ms")`. `None` when there are no leading digits;
/// `Some((None, _))` when the number does not fit in a u64.
fn split_number(s: &str) -> Option<(Option<u64>, &str)> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    Some((s[..end].parse().ok(), s[end..].trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_every_unit() {
        let cases = [
            ("10us", Duration::from_micros(10)),
            ("500ms", Duration::from_millis(500)),
            ("3s", Duration::from_secs(3)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0s", Duration::ZERO),
            (" 5 s ", Duration::from_secs(5)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn durations_reject_with_a_reason() {
        let cases = [
            (
                "5",
                r#"invalid duration "5": missing unit (us, ms, s, m, h), e.g. "5s""#,
            ),
            (
                "",
                r#"invalid duration "": expected a whole number and a unit (us, ms, s, m, h), e.g. "5s""#,
            ),
            (
                "-1s",
                r#"invalid duration "-1s": expected a whole number and a unit (us, ms, s, m, h), e.g. "5s""#,
            ),
            (
                "5sec",
                r#"invalid duration "5sec": unknown unit "sec", expected one of us, ms, s, m, h"#,
            ),
            (
                "1.5s",
                r#"invalid duration "1.5s": fractions are not supported; use a smaller unit, e.g. "1500ms""#,
            ),
            (
                "99999999999999999999s",
                r#"invalid duration "99999999999999999999s": too large"#,
            ),
            (
                "18446744073709551615h",
                r#"invalid duration "18446744073709551615h": too large"#,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Err(want.to_string()), "{text:?}");
        }
    }

    #[test]
    fn sizes_are_1024_based() {
        let cases = [
            ("512B", 512),
            ("512", 512),
            ("0", 0),
            ("64kB", 64 << 10),
            ("64KB", 64 << 10),
            ("64KiB", 64 << 10),
            ("16MB", 16 << 20),
            ("16 MiB", 16 << 20),
            ("1GB", 1 << 30),
            ("2TB", 2 << 40),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn sizes_reject_with_a_reason() {
        let cases = [
            (
                "MB",
                r#"invalid size "MB": expected a whole number and an optional unit (B, kB (or KB), MB, GB, TB), e.g. "16MB""#,
            ),
            (
                "16mb",
                r#"invalid size "16mb": unknown unit "mb", expected one of B, kB (or KB), MB, GB, TB (1024-based)"#,
            ),
            (
                "1.5GB",
                r#"invalid size "1.5GB": fractions are not supported; use a smaller unit, e.g. "1536kB""#,
            ),
            (
                "99999999999TB",
                r#"invalid size "99999999999TB": too large"#,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Err(want.to_string()), "{text:?}");
        }
    }
}
