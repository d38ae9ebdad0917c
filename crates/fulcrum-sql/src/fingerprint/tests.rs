//! The fingerprint's tests: what normalises together and what does not,
//! and that the keyed hash is the hash of the normalised text.

use super::*;

fn pg(s: &str) -> u64 {
    fingerprint(s, Dialect::Postgres)
}

#[test]
fn literals_are_normalised() {
    assert_eq!(
        pg("SELECT abalance FROM pgbench_accounts WHERE aid = 1;"),
        pg("select  abalance from pgbench_accounts where aid = 98765;")
    );
    assert_eq!(pg("SELECT 'a'"), pg("SELECT 'it''s'"));
    assert_eq!(pg("SELECT E'a\\'b'"), pg("SELECT 'x'"));
    assert_eq!(pg("DO $$ BEGIN END $$"), pg("DO $f$ other $f$"));
    assert_eq!(pg("SELECT 1 /* c */"), pg("SELECT 2 -- c"));
}

#[test]
fn normalised_text_is_what_the_fingerprint_hashes() {
    let n = |s| normalize(s, Dialect::Postgres, 100);
    assert_eq!(
        n("SELECT abalance  FROM pgbench_accounts\n WHERE aid = 42; -- x"),
        "select abalance from pgbench_accounts where aid = ?;"
    );
    assert_eq!(
        n("SELECT 'a', $x$ b $x$, \"Mixed\""),
        "select ?, ?, \"Mixed\""
    );
    assert_eq!(
        normalize("select * from `T` where a = 'x' # c", Dialect::MySql, 100),
        "select * from `T` where a = ?"
    );
    assert_eq!(
        n("SELECT A_1, T2.x9 FROM Tab_2 WHERE c=3 AND xe'q' = $1 AND e'r'=E'\\s'"),
        "select a_1, t2.x9 from tab_2 where c=? and xe? = $1 and ?=?"
    );
    assert_eq!(
        normalize("SELECT 123456", Dialect::Postgres, 6),
        "select..."
    );
    assert_eq!(
        normalize("SELECT 'é' AS café", Dialect::Postgres, 100),
        "select ? as café"
    );
}

#[test]
fn structure_is_kept() {
    assert_ne!(pg("SELECT a FROM t"), pg("SELECT b FROM t"));
    assert_ne!(pg("SELECT \"A\" FROM t"), pg("SELECT \"a\" FROM t"));
    assert_ne!(pg("SELECT $1"), pg("SELECT $2"));
    assert_ne!(pg("SELECT nextval('s')"), pg("SELECT currval('s')"));
    assert_ne!(pg("SELECT t1.a FROM t1"), pg("SELECT t2.a FROM t2"));
    assert_ne!(pg("SELECT 1 FOR UPDATE"), pg("SELECT 1"));
}

#[test]
fn mysql_comments_and_executable_comments() {
    let my = |s| fingerprint(s, Dialect::MySql);
    assert_eq!(my("SELECT 1 # c"), my("SELECT 2"));
    assert_ne!(my("SELECT 1 /*! FOR UPDATE */"), my("SELECT 1"));
    assert_eq!(
        my("SELECT `Id` FROM t WHERE id = 'x\\'y'"),
        my("SELECT `Id` FROM t WHERE id = 'z'")
    );
}

#[test]
fn mysql_double_quoted_strings_are_literals_in_digests() {
    let n = |s| normalize(s, Dialect::MySql, 200);
    assert_eq!(
        n("ALTER USER u IDENTIFIED BY \"S3cret\""),
        "alter user u identified by ?"
    );
    assert_eq!(
        n("SELECT * FROM t WHERE email = \"alice@x\" AND n = \"a\\\"b\""),
        "select * from t where email = ? and n = ?"
    );
    assert_eq!(
        n("/*!50000 ALTER USER u IDENTIFIED BY \"S3cret\" */"),
        "!? alter user u identified by ? */"
    );
    // PostgreSQL's "..." is a name, kept.
    assert_eq!(
        normalize("SELECT \"Col\"", Dialect::Postgres, 50),
        "select \"Col\""
    );
}

#[test]
fn an_unterminated_literal_is_not_a_literal() {
    assert_ne!(pg("SELECT 'unterminated"), pg("SELECT 1"));
}

#[test]
fn block_comments_nest() {
    assert_eq!(block_comment_end(b"/* a /* b */ c */ d", 0), Some(17));
    assert_eq!(block_comment_end(b"x /* open", 2), None);
}

#[test]
fn unterminated_input_does_not_panic() {
    for s in [
        "SELECT 'abc",
        "SELECT \"abc",
        "/* open",
        "SELECT $a$ x",
        "SELECT E'\\",
        "$",
        "--",
    ] {
        let _ = pg(s);
        let _ = fingerprint(s, Dialect::MySql);
    }
}

#[test]
fn a_scan_says_whether_the_text_has_comments() {
    for (sql, comments) in [
        ("SELECT 1", false),
        ("SELECT '/* not a comment */'", false),
        ("SELECT 1 /* c */", true),
        ("SELECT 1 -- c", true),
        ("SELECT 1 # c", false),
    ] {
        let s = scan(sql, Dialect::Postgres);
        assert_eq!(s.comments, comments, "{sql}");
        assert_eq!(s.key, fingerprint(sql, Dialect::Postgres));
    }
    assert!(scan("SELECT 1 # c", Dialect::MySql).comments);
}

/// The keyed hash fed eight bytes at a time (`word_bytes`) and a block at a
/// time hashes exactly the text `normalize` gives, for names of every
/// length and alignment, mixed case, digits, `_`, non-ASCII bytes and the
/// other tokens around them.
#[test]
fn the_key_is_the_hash_of_the_normalised_text() {
    use std::hash::Hasher;
    let pieces = [
        "SELECT",
        "abalance",
        "FROM",
        "pgbench_accounts",
        "WhErE",
        "aid",
        "=",
        "12345",
        ";",
        " ",
        "  ",
        "\n",
        "_x9",
        "Z",
        "a_very_long_identifier_that_runs_past_one_block_of_sixty_four_bytes_ABCDEFGHIJ",
        "'lit'",
        "\"Quoted Name\"",
        "$1",
        "é",
        "naïve",
        "x1y2",
        "(",
        ")",
        ",",
        "E'esc'",
        "--c\n",
        "/* c */",
        "@",
        "[",
        "`",
        "{",
        "0.5",
        "9e3",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..4000 {
        let mut sql = String::new();
        let n = (seed % 23) as usize + 1;
        for _ in 0..n {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            sql.push_str(pieces[(seed % pieces.len() as u64) as usize]);
            if seed.is_multiple_of(3) {
                sql.push(' ');
            }
        }
        for dialect in [Dialect::Postgres, Dialect::MySql] {
            let text = normalize(&sql, dialect, usize::MAX);
            let mut h = *keys();
            h.write(text.as_bytes());
            assert_eq!(
                scan(&sql, dialect).key,
                h.finish(),
                "{sql:?} ({dialect:?}) -> {text:?}"
            );
        }
    }
    let cases = [
        (*b"abcdefgh", 8),
        (*b"ABC_9xyz", 8),
        (*b"ab cdefg", 2),
        (*b"\xc3\xa9abcdef", 0),
        (*b"a`@[{/:z", 1),
    ];
    for (x, k) in cases {
        let (lowered, n) = word_bytes(u64::from_le_bytes(x));
        assert_eq!(n, k, "{x:?}");
        let lowered = lowered.to_le_bytes();
        for j in 0..n {
            assert_eq!(lowered[j], x[j].to_ascii_lowercase(), "{x:?}");
        }
    }
}
