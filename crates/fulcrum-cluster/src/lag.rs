//! Replication lag: a replica's distance behind the primary in bytes of WAL
//! (or GTID sequence numbers on MariaDB) and in time, and whether it is over
//! `max_lag`. A replica taken out for lag comes back once it is under half
//! the limit, so one hovering at the limit does not flap. Pure.

use std::time::Duration;

use fulcrum_config::MaxLag;

/// How far a replica is behind the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lag {
    pub bytes: u64,
    pub time: Duration,
}

/// Lag from the primary's current position, the replica's replayed position
/// and the age of the last change the replica replayed. A replica that has
/// replayed everything has no lag in time, however old its last change is
/// (an idle primary).
pub fn lag_of(primary_position: u64, replayed: u64, replay_age: Option<Duration>) -> Lag {
    let bytes = primary_position.saturating_sub(replayed);
    let time = if bytes == 0 {
        Duration::ZERO
    } else {
        replay_age.unwrap_or(Duration::ZERO)
    };
    Lag { bytes, time }
}

/// Whether a replica with `lag` is kept out of reads. `lagging` is whether
/// it is out now: it comes back under half the limit.
pub fn over_limit(lag: Lag, max: MaxLag, lagging: bool) -> bool {
    match (max, lagging) {
        (MaxLag::Bytes(m), false) => lag.bytes > m,
        (MaxLag::Bytes(m), true) => lag.bytes > m / 2,
        (MaxLag::Time(m), false) => lag.time > m,
        (MaxLag::Time(m), true) => lag.time > m / 2,
    }
}

/// Parses a PostgreSQL LSN as printed (`16/B374D848`).
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.trim().split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

/// Formats an LSN the way PostgreSQL prints it.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_parse_and_print_like_postgres() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x3000060));
        assert_eq!(parse_lsn("16/B374D848"), Some((0x16 << 32) | 0xB374D848));
        assert_eq!(format_lsn((0x16 << 32) | 0xB374D848), "16/B374D848");
        assert_eq!(parse_lsn(""), None);
        assert_eq!(parse_lsn("0/xyz"), None);
        assert_eq!(parse_lsn("123"), None);
    }

    #[test]
    fn a_caught_up_replica_has_no_lag_in_time() {
        let idle = lag_of(1000, 1000, Some(Duration::from_secs(600)));
        assert_eq!(idle, Lag::default());
        let behind = lag_of(5000, 1000, Some(Duration::from_secs(3)));
        assert_eq!(behind.bytes, 4000);
        assert_eq!(behind.time, Duration::from_secs(3));
        assert_eq!(lag_of(10, 20, None).bytes, 0, "ahead of the last probe");
    }

    #[test]
    fn a_lagging_replica_comes_back_under_half_the_limit() {
        let max = MaxLag::Bytes(1000);
        let lag = |bytes| Lag {
            bytes,
            time: Duration::ZERO,
        };
        assert!(!over_limit(lag(1000), max, false));
        assert!(over_limit(lag(1001), max, false));
        assert!(over_limit(lag(800), max, true), "still out at 800");
        assert!(!over_limit(lag(500), max, true));
        let max = MaxLag::Time(Duration::from_secs(2));
        let lag = |ms| Lag {
            bytes: 1,
            time: Duration::from_millis(ms),
        };
        assert!(over_limit(lag(2500), max, false));
        assert!(over_limit(lag(1500), max, true));
        assert!(!over_limit(lag(900), max, true));
    }
}
