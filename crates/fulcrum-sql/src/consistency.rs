//! The consistency controls clients write in SQL (docs/consistency.md): the
//! per-statement hint `/* fulcrum:consistency=NAME */` and the session
//! statements `SET/RESET/SHOW fulcrum.consistency`; and the causal token
//! across connections: `SHOW fulcrum.position` (PostgreSQL) or
//! `SELECT @@fulcrum_position` (MySQL), `SET fulcrum.min_position = '...'`
//! (`SET @@fulcrum_min_position = '...'` on MySQL) and the hint
//! `/* fulcrum:after=POSITION */`. Pure text scanning, shared by both
//! protocols; names and positions are checked by the caller.

/// Hints are looked for in this many bytes at the start of a statement.
const HINT_WINDOW: usize = 256;
const HINT: &[u8] = b"fulcrum:consistency=";
/// The setting's name in `SET fulcrum.consistency = ...`.
pub const SETTING: &str = "fulcrum.consistency";

/// The mode named by a `fulcrum:consistency=NAME` hint in the first bytes
/// of `text` (the name is not checked here).
pub fn hinted(text: &[u8]) -> Option<&str> {
    let window = &text[..text.len().min(HINT_WINDOW)];
    let at = window.windows(HINT.len()).position(|w| w == HINT)? + HINT.len();
    let len = text[at..]
        .iter()
        .take_while(|b| b.is_ascii_alphabetic())
        .count();
    std::str::from_utf8(&text[at..at + len])
        .ok()
        .filter(|n| !n.is_empty())
}

const AFTER_HINT: &[u8] = b"fulcrum:after=";

/// The position named by a `fulcrum:after=POSITION` hint in the first bytes
/// of `text` (a PostgreSQL LSN such as `0/3062A10`, or MariaDB GTIDs such as
/// `0-1-42,1-2-7`; not checked here).
pub fn hinted_after(text: &[u8]) -> Option<&str> {
    let window = &text[..text.len().min(HINT_WINDOW)];
    let at = window
        .windows(AFTER_HINT.len())
        .position(|w| w == AFTER_HINT)?
        + AFTER_HINT.len();
    let len = text[at..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b','))
        .count();
    std::str::from_utf8(&text[at..at + len])
        .ok()
        .filter(|n| !n.is_empty())
}

/// A statement about the causal token.
#[derive(Debug, PartialEq, Eq)]
pub enum PositionOp<'a> {
    /// `SHOW fulcrum.position` / `SELECT @@fulcrum_position`.
    Show,
    /// `SET fulcrum.min_position = '...'` / `SET @@fulcrum_min_position = '...'`.
    SetMin(&'a str),
}

/// Recognises `SHOW fulcrum.position`, `SELECT @@fulcrum_position` and
/// `SET [SESSION] fulcrum.min_position = 'v'` (or `TO v`; `@@fulcrum_min_position`
/// or `@fulcrum_min_position` on MySQL).
pub fn position_op(text: &str) -> Option<PositionOp<'_>> {
    let t = text.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = t
        .split(|c: char| c.is_whitespace() || c == '=')
        .filter(|w| !w.is_empty())
        .collect();
    let is = |w: &str, name: &str| w.eq_ignore_ascii_case(name);
    match words.as_slice() {
        [show, name] if is(show, "show") && is(name, "fulcrum.position") => Some(PositionOp::Show),
        [select, name] if is(select, "select") && is(name, "@@fulcrum_position") => {
            Some(PositionOp::Show)
        }
        [set, rest @ ..] if is(set, "set") => {
            let rest = match rest {
                [session, more @ ..] if is(session, "session") => more,
                r => r,
            };
            let (name, value) = match rest {
                [name, to, v] if is(to, "to") => (*name, *v),
                [name, v] => (*name, *v),
                _ => return None,
            };
            let known = [
                "fulcrum.min_position",
                "@@fulcrum_min_position",
                "@fulcrum_min_position",
            ];
            if !known.iter().any(|k| is(name, k)) {
                return None;
            }
            let value = value.trim_matches(|c| c == '\'' || c == '"');
            (!value.is_empty()).then_some(PositionOp::SetMin(value))
        }
        _ => None,
    }
}

/// A statement about `fulcrum.consistency`.
#[derive(Debug, PartialEq, Eq)]
pub enum SettingOp<'a> {
    /// `SET [SESSION] fulcrum.consistency = 'name'` (or `TO name`).
    Set(&'a str),
    /// `RESET fulcrum.consistency`, or `SET ... TO DEFAULT`.
    Reset,
    /// `SHOW fulcrum.consistency`.
    Show,
}

/// Recognises a statement about `fulcrum.consistency`.
pub fn setting_op(text: &str) -> Option<SettingOp<'_>> {
    setting_op_for(text, SETTING)
}

/// Recognises a statement about Fulcrum's own session setting `name`
/// (`fulcrum.consistency`, or on MySQL `fulcrum.cache`): `SET [SESSION]
/// name = value` (or `TO value`), `RESET name`, `SHOW name`.
pub fn setting_op_for<'a>(text: &'a str, name: &str) -> Option<SettingOp<'a>> {
    let t = text.trim().trim_end_matches(';').trim();
    let mut words = t
        .split(|c: char| c.is_whitespace() || c == '=')
        .filter(|w| !w.is_empty());
    let verb = words.next()?;
    let mut next = words.next()?;
    if verb.eq_ignore_ascii_case("set") && next.eq_ignore_ascii_case("session") {
        next = words.next()?;
    }
    if !next.eq_ignore_ascii_case(name) {
        return None;
    }
    let rest: Vec<&str> = words.collect();
    if verb.eq_ignore_ascii_case("show") && rest.is_empty() {
        return Some(SettingOp::Show);
    }
    if verb.eq_ignore_ascii_case("reset") && rest.is_empty() {
        return Some(SettingOp::Reset);
    }
    if !verb.eq_ignore_ascii_case("set") {
        return None;
    }
    let value = match rest.as_slice() {
        [to, v] if to.eq_ignore_ascii_case("to") => *v,
        [v] => *v,
        _ => return None,
    };
    let value = value.trim_matches(|c| c == '\'' || c == '"');
    if value.eq_ignore_ascii_case("default") {
        return Some(SettingOp::Reset);
    }
    Some(SettingOp::Set(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_setting_of_fulcrum_s_is_recognised_by_its_name() {
        let op = |t| setting_op_for(t, "fulcrum.cache");
        assert_eq!(op("SET fulcrum.cache = off"), Some(SettingOp::Set("off")));
        assert_eq!(
            op("set session FULCRUM.CACHE to 'on';"),
            Some(SettingOp::Set("on"))
        );
        assert_eq!(op("RESET fulcrum.cache"), Some(SettingOp::Reset));
        assert_eq!(op("SHOW fulcrum.cache"), Some(SettingOp::Show));
        assert_eq!(op("SET fulcrum.consistency = strong"), None);
        assert_eq!(setting_op("SET fulcrum.cache = off"), None);
    }

    #[test]
    fn hints_are_found_at_the_start() {
        assert_eq!(
            hinted(b"/* fulcrum:consistency=eventual */ SELECT 1"),
            Some("eventual")
        );
        assert_eq!(
            hinted(b"SELECT /* fulcrum:consistency=strong */ 1"),
            Some("strong")
        );
        assert_eq!(hinted(b"SELECT 'fulcrum:consistency='"), None);
        let far = format!(
            "SELECT {} /* fulcrum:consistency=strong */",
            "x".repeat(300)
        );
        assert_eq!(hinted(far.as_bytes()), None, "only the first 256 bytes");
    }

    #[test]
    fn causal_token_statements_and_hints_parse() {
        use PositionOp::*;
        assert_eq!(position_op("SHOW fulcrum.position;"), Some(Show));
        assert_eq!(position_op("select @@fulcrum_position"), Some(Show));
        assert_eq!(
            position_op("SET fulcrum.min_position = '0/3062A10'"),
            Some(SetMin("0/3062A10"))
        );
        assert_eq!(
            position_op("set session fulcrum.min_position to '0-1-42,1-2-7'"),
            Some(SetMin("0-1-42,1-2-7"))
        );
        assert_eq!(
            position_op("SET @@fulcrum_min_position='0-1-9'"),
            Some(SetMin("0-1-9"))
        );
        assert_eq!(position_op("SET fulcrum.min_position = ''"), None);
        assert_eq!(position_op("SHOW fulcrum.consistency"), None);
        assert_eq!(position_op("SELECT @@version"), None);
        assert_eq!(
            hinted_after(b"/* fulcrum:after=0/3062A10 */ SELECT 1"),
            Some("0/3062A10")
        );
        assert_eq!(
            hinted_after(b"SELECT /* fulcrum:after=0-1-42,1-2-7 */ 1"),
            Some("0-1-42,1-2-7")
        );
        assert_eq!(hinted_after(b"SELECT 1"), None);
    }

    #[test]
    fn setting_statements_parse() {
        use SettingOp::*;
        assert_eq!(
            setting_op("SET fulcrum.consistency = 'eventual'"),
            Some(Set("eventual"))
        );
        assert_eq!(
            setting_op("set session fulcrum.consistency to strong;"),
            Some(Set("strong"))
        );
        assert_eq!(
            setting_op("SET fulcrum.consistency='session'"),
            Some(Set("session"))
        );
        assert_eq!(
            setting_op("SET fulcrum.consistency = 'nope'"),
            Some(Set("nope"))
        );
        assert_eq!(
            setting_op("SET fulcrum.consistency TO DEFAULT"),
            Some(Reset)
        );
        assert_eq!(setting_op("RESET fulcrum.consistency"), Some(Reset));
        assert_eq!(setting_op("SHOW fulcrum.consistency"), Some(Show));
        assert_eq!(setting_op("SET search_path = 'x'"), None);
        assert_eq!(setting_op("SET fulcrum.consistency = a b"), None);
    }
}
