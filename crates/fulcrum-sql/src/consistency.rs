//! The consistency controls clients write in SQL (docs/consistency.md): the
//! per-statement hint `/* fulcrum:consistency=NAME */` and the session
//! statements `SET/RESET/SHOW fulcrum.consistency`. Pure text scanning, shared
//! by both protocols; the names are checked by the caller.

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
    let t = text.trim().trim_end_matches(';').trim();
    let mut words = t
        .split(|c: char| c.is_whitespace() || c == '=')
        .filter(|w| !w.is_empty());
    let verb = words.next()?;
    let mut next = words.next()?;
    if verb.eq_ignore_ascii_case("set") && next.eq_ignore_ascii_case("session") {
        next = words.next()?;
    }
    if !next.eq_ignore_ascii_case(SETTING) {
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
