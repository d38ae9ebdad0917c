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

/// MySQL's character sets whose multibyte characters may end in `\`
/// (0x5c) or a letter: the server then reads a backslash
/// Fulcrum takes for an escape as part of a character (the old
/// `addslashes` injection), and a literal ends where Fulcrum does not see it.
const MYSQL_APART: [&str; 5] = ["big5", "cp932", "gbk", "sjis", "gb18030"];

/// Whether MySQL text in the character set or collation `name` (`gbk`,
/// `sjis_japanese_ci`) is lexed by Fulcrum as the server lexes it.
pub fn mysql_lexes_like_the_server(name: &str) -> bool {
    let name = name.trim_matches(|c| c == '\'' || c == '"' || c == '`');
    !MYSQL_APART.iter().any(|cs| {
        name.len() >= cs.len()
            && name.as_bytes()[..cs.len()].eq_ignore_ascii_case(cs.as_bytes())
            && (name.len() == cs.len() || name.as_bytes()[cs.len()] == b'_')
    })
}

/// [`mysql_lexes_like_the_server`] of the collation a client named in its
/// handshake (its id: big5 1 and 84, sjis 13 and 88, gbk 28 and 87, cp932
/// 95 and 96, MySQL's gb18030 248 to 250).
pub fn mysql_collation_lexes_like_the_server(id: u8) -> bool {
    !matches!(id, 1 | 84 | 13 | 88 | 28 | 87 | 95 | 96 | 248..=250)
}

/// Whether a MySQL `SET` statement Fulcrum tracks may name such a
/// character set (`SET NAMES gbk`, `SET character_set_client = 'sjis'`,
/// `SET CHARACTER SET big5`): any word of it that is one, or a collation
/// of one. Errs towards yes (a user variable set to `'gbk'` pins anyway).
pub fn mysql_set_lexes_apart(set: &str) -> bool {
    set.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| !word.is_empty() && !mysql_lexes_like_the_server(word))
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

    #[test]
    fn mysql_character_sets_that_lex_apart() {
        for name in [
            "gbk",
            "GBK",
            "sjis_japanese_ci",
            "'cp932'",
            "big5_bin",
            "gb18030",
        ] {
            assert!(!mysql_lexes_like_the_server(name), "{name}");
        }
        for name in [
            "utf8mb4", "latin1", "gb2312", "ujis", "euckr", "gbkx", "sjisy", "gbé",
        ] {
            assert!(mysql_lexes_like_the_server(name), "{name}");
        }
        assert!(!mysql_collation_lexes_like_the_server(28));
        assert!(
            mysql_collation_lexes_like_the_server(45),
            "utf8mb4_general_ci"
        );
        assert!(mysql_set_lexes_apart("SET NAMES gbk"));
        assert!(mysql_set_lexes_apart("SET character_set_client = 'sjis'"));
        assert!(mysql_set_lexes_apart("SET NAMES utf8mb4 COLLATE big5_bin"));
        assert!(!mysql_set_lexes_apart("SET NAMES utf8mb4"));
        assert!(!mysql_set_lexes_apart("SET sql_mode = 'ANSI_QUOTES'"));
    }
}
