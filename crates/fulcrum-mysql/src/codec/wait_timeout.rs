//! The session `wait_timeout` a SET statement gives (`SET wait_timeout =
//! 5`, `SET SESSION wait_timeout = 5`, `SET @@wait_timeout = 5`, `SET
//! @@session.wait_timeout = 5`, one of a list), which Fulcrum honours as the
//! client's own idle timeout; `GLOBAL` ones are not the session's. Pure.

use std::time::Duration;

/// The session wait_timeout `set` assigns, if it assigns one (the last).
pub fn session_wait_timeout(set: &str) -> Option<Duration> {
    let lower = set.to_ascii_lowercase();
    let b = lower.as_bytes();
    let mut found = None;
    let mut from = 0;
    while let Some(p) = lower[from..].find("wait_timeout") {
        let at = from + p;
        from = at + "wait_timeout".len();
        let before = &lower[..at];
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$';
        if at > 0 && ident(b[at - 1]) {
            continue; // interactive_wait_timeout and the like
        }
        let global = before.ends_with("@@global.")
            || before.trim_end().ends_with("global")
            || before.trim_end().ends_with("persist");
        if global {
            continue;
        }
        let rest = lower[from..].trim_start();
        let Some(rest) = rest.strip_prefix(":=").or_else(|| rest.strip_prefix('=')) else {
            continue;
        };
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(seconds) = digits.parse::<u64>() {
            found = Some(Duration::from_secs(seconds.max(1)));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_assignments_are_read_and_global_ones_are_not() {
        let s = |n| Some(Duration::from_secs(n));
        assert_eq!(session_wait_timeout("SET wait_timeout = 1"), s(1));
        assert_eq!(session_wait_timeout("set session wait_timeout=30"), s(30));
        assert_eq!(session_wait_timeout("SET @@wait_timeout := 7"), s(7));
        assert_eq!(session_wait_timeout("SET @@session.wait_timeout = 9"), s(9));
        assert_eq!(session_wait_timeout("SET @@local.wait_timeout = 9"), s(9));
        assert_eq!(
            session_wait_timeout("SET NAMES utf8mb4, wait_timeout = 2, autocommit = 1"),
            s(2)
        );
        assert_eq!(session_wait_timeout("SET GLOBAL wait_timeout = 1"), None);
        assert_eq!(session_wait_timeout("SET @@global.wait_timeout = 1"), None);
        assert_eq!(session_wait_timeout("SET interactive_timeout = 1"), None);
        assert_eq!(session_wait_timeout("SET net_read_timeout = 1"), None);
        assert_eq!(session_wait_timeout("SET wait_timeout = DEFAULT"), None);
    }
}
