//! Statement text in a client's encoding, as the classifier reads it.
//! Fulcrum lexes UTF-8. That is sound for any encoding in which a byte
//! below 0x80 is always that ASCII character (UTF-8, LATIN1 and every
//! other encoding PostgreSQL can use on the server side): quotes,
//! backslashes, semicolons and keywords are where the server sees them,
//! and only the text of literals and names can differ. It is not sound for
//! the encodings PostgreSQL accepts only from clients (SJIS, BIG5, GBK,
//! UHC, GB18030, JOHAB), whose second byte of a character may be `\` or a
//! letter: there Fulcrum cannot tell where a literal ends, and a statement
//! can hide behind what it reads as a string. Pure functions.

use std::borrow::Cow;

/// `bytes` as text to classify: itself when it is UTF-8 (no copy), else
/// each byte that is not part of a UTF-8 character replaced by U+FFFD
/// (a LATIN1 client's `'café'`), which keeps every ASCII byte where it was.
/// Only sound when the client's encoding is ASCII-safe
/// ([`lexes_like_the_server`]).
#[inline]
pub fn statement_text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => not_utf8(bytes),
    }
}

#[cold]
#[inline(never)]
fn not_utf8(bytes: &[u8]) -> Cow<'_, str> {
    Cow::Owned(String::from_utf8_lossy(bytes).into_owned())
}

/// Whether text in the client encoding `name` (as PostgreSQL reports
/// `client_encoding`, any case) is lexed by Fulcrum as the server lexes it:
/// false for the client-only encodings whose multibyte characters may end
/// in an ASCII byte.
pub fn lexes_like_the_server(name: &str) -> bool {
    const APART: [&str; 13] = [
        "SJIS",
        "SHIFT_JIS_2004",
        "BIG5",
        "GBK",
        "UHC",
        "GB18030",
        "JOHAB",
        // PostgreSQL's aliases, in case a name is reported as given.
        "WIN932",
        "WIN936",
        "WIN949",
        "WIN950",
        "SHIFT_JIS",
        "MSKANJI",
    ];
    !APART.iter().any(|a| a.eq_ignore_ascii_case(name.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_borrowed_and_other_bytes_keep_the_ascii_where_it_was() {
        let ok = "SELECT 'café'";
        assert!(matches!(statement_text(ok.as_bytes()), Cow::Borrowed(t) if t == ok));
        let latin1 = b"SELECT set_config('a.b', 'caf\xe9', false)";
        let text = statement_text(latin1);
        assert_eq!(text, "SELECT set_config('a.b', 'caf\u{fffd}', false)");
        // Every ASCII byte is still there, in order.
        let ascii: Vec<u8> = latin1.iter().copied().filter(u8::is_ascii).collect();
        let kept: Vec<u8> = text.bytes().filter(u8::is_ascii).collect();
        assert_eq!(ascii, kept);
    }

    #[test]
    fn the_client_only_encodings_lex_apart() {
        for name in [
            "SJIS",
            "sjis",
            "BIG5",
            "GBK",
            "UHC",
            "GB18030",
            "JOHAB",
            "SHIFT_JIS_2004",
        ] {
            assert!(!lexes_like_the_server(name), "{name}");
        }
        for name in ["UTF8", "LATIN1", "WIN1252", "EUC_JP", "SQL_ASCII", "KOI8R"] {
            assert!(lexes_like_the_server(name), "{name}");
        }
    }

    /// What a LATIN1 client sends is classified as its UTF-8 twin would
    /// be, except that a setting it would track pins instead.
    #[test]
    fn text_that_is_not_utf8_is_classified_and_its_settings_pin() {
        use crate::{Classifier, ClassifierConfig, Decision, Dialect, Effect};
        let c = Classifier::new(Dialect::Postgres, &ClassifierConfig::default());
        let read = c.classify_bytes(b"SELECT * FROM t WHERE name = 'caf\xe9'");
        assert_eq!(read.decision, Decision::Read);
        assert!(read.effects.is_empty());
        let write = c.classify_bytes(b"UPDATE t SET name = 'caf\xe9'");
        assert_eq!(write.decision, Decision::Write);
        for setting in [
            &b"SELECT set_config('app.x', 'caf\xe9', false)"[..],
            b"SET app.x = 'caf\xe9'",
        ] {
            let unit = c.classify_bytes(setting);
            let effects: Vec<Effect> = unit.effects.to_vec();
            assert!(
                matches!(effects.as_slice(), [Effect::Pin(_)]),
                "{}: {effects:?}",
                String::from_utf8_lossy(setting)
            );
        }
        // The same statement in UTF-8 is tracked as a setting, not pinned.
        let utf8 = c.classify_bytes("SET app.x = 'café'".as_bytes());
        assert!(matches!(
            utf8.effects.to_vec().as_slice(),
            [Effect::Set { .. }]
        ));
    }
}
