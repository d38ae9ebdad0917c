//! MySQL and MariaDB forms that sqlparser 0.63 reads differently from the
//! server or cannot parse, brought to something the rules can classify:
//! `SET SESSION|GLOBAL TRANSACTION`, MariaDB's `SET STATEMENT ... FOR <stmt>`,
//! `DO <expr>`, `SELECT ... INTO @var` after the FROM clause, and unparsed
//! `SET` lists that assign in a server-wide scope. The scans use sqlparser's
//! tokenizer, so quotes and comments are read as the parser reads them.

use sqlparser::dialect::MySqlDialect;
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::decision::Decision;

/// `SET SESSION TRANSACTION ...` sets the session default (replayed), `SET
/// GLOBAL TRANSACTION ...` the server's (a write); sqlparser reads both as a
/// plain `SET TRANSACTION`.
pub(crate) fn quirk(sql: &str) -> Option<Decision> {
    let t = sql.trim_start();
    if t.contains(';') {
        return None;
    }
    let mut words = t.split_whitespace().map(str::to_ascii_lowercase);
    let (first, second, third) = (words.next(), words.next(), words.next());
    if first.as_deref() != Some("set") {
        return None;
    }
    match (second.as_deref(), third.as_deref()) {
        (Some("session" | "local"), Some("transaction")) => Some(Decision::Set),
        (Some("global"), Some("transaction")) => Some(Decision::Write),
        // No scope: the next transaction's, a pin (`rules.rs`).
        _ => None,
    }
}

/// MariaDB's `SET STATEMENT var = value [, ...] FOR <statement>`: the text of
/// `<statement>` (and whatever follows it). The variables last for that one
/// statement, so it routes as the statement does.
pub(crate) fn set_statement_body<'a>(tokens: &Tokens<'a>) -> Option<&'a str> {
    let (sql, t) = (tokens.sql, &tokens.list);
    if !(is_word(t.first()?, "set") && is_word(t.get(1)?, "statement")) {
        return None;
    }
    let at = top_level(&t[2..]).find(|&i| is_word(&t[2 + i], "for"))? + 2;
    Some(&sql[offset(sql, t.get(at + 1)?.span.start)..])
}

/// `DO expr [, expr ...]` evaluates its expressions as `SELECT expr, ...`
/// does, and discards the result: that SELECT.
pub(crate) fn do_as_select(tokens: &Tokens<'_>) -> Option<String> {
    let (sql, t) = (tokens.sql, &tokens.list);
    let first = t.first()?;
    let rest = &sql[offset(sql, first.span.end)..];
    is_word(first, "do").then(|| format!("SELECT {}", rest.trim_start()))
}

/// A SELECT with `INTO @var [, @var ...]` where sqlparser does not take it
/// (at the end, MySQL 8's preferred place): the statement without the INTO.
pub(crate) fn without_into_variables(tokens: &Tokens<'_>) -> Option<String> {
    let (sql, t) = (tokens.sql, &tokens.list);
    let first = t.first()?;
    if !(is_word(first, "select") || is_word(first, "with") || first.token == Token::LParen) {
        return None;
    }
    let into = top_level(t).find(|&i| is_word(&t[i], "into"))?;
    let mut last = into + 1;
    if !user_variable(t.get(last)?) {
        return None;
    }
    while t.get(last + 1).is_some_and(|c| c.token == Token::Comma)
        && t.get(last + 2).is_some_and(user_variable)
    {
        last += 2;
    }
    let (from, to) = (
        offset(sql, t[into].span.start),
        offset(sql, t[last].span.end),
    );
    Some(format!("{} {}", &sql[..from], &sql[to..]))
}

/// An unparsed `SET` whose list assigns in a server-wide scope somewhere:
/// `GLOBAL`, `PERSIST`, `PERSIST_ONLY`, `@@global.x`, `@@persist.x`, ...
pub(crate) fn sets_server_scope(tokens: Option<&Tokens<'_>>) -> bool {
    const SCOPES: [&str; 6] = [
        "global",
        "persist",
        "persist_only",
        "@@global",
        "@@persist",
        "@@persist_only",
    ];
    let Some(t) = tokens.map(|t| &t.list) else {
        return false;
    };
    let assignment_start = |i: usize| i == 1 || i > 1 && t[i - 1].token == Token::Comma;
    t.first().is_some_and(|w| is_word(w, "set"))
        && top_level(t).any(|i| assignment_start(i) && SCOPES.iter().any(|s| is_word(&t[i], s)))
}

/// A statement's tokens without white space and comments, made once and
/// read by every MySQL form below.
pub(crate) struct Tokens<'a> {
    sql: &'a str,
    list: Vec<TokenWithSpan>,
}

impl<'a> Tokens<'a> {
    /// `None` when `sql` does not even tokenize.
    pub(crate) fn of(sql: &'a str) -> Option<Tokens<'a>> {
        let all = Tokenizer::new(&MySqlDialect {}, sql)
            .with_unescape(false)
            .tokenize_with_location()
            .ok()?;
        Some(Tokens {
            sql,
            list: all
                .into_iter()
                .filter(|t| !matches!(t.token, Token::Whitespace(_)))
                .collect(),
        })
    }
}

/// Indices of the tokens outside parentheses, up to the first `;`.
fn top_level(t: &[TokenWithSpan]) -> impl Iterator<Item = usize> + '_ {
    t.iter()
        .enumerate()
        .scan(0usize, |depth, (i, tok)| {
            let outside = *depth == 0;
            match tok.token {
                Token::LParen => *depth += 1,
                Token::RParen => *depth = depth.saturating_sub(1),
                Token::SemiColon if outside => return None,
                _ => {}
            }
            Some(outside.then_some(i))
        })
        .flatten()
}

/// An unquoted word, case-insensitively.
fn is_word(t: &TokenWithSpan, word: &str) -> bool {
    matches!(&t.token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// `@name`, not `@@name` (a system variable).
fn user_variable(t: &TokenWithSpan) -> bool {
    matches!(&t.token, Token::Word(w) if w.quote_style.is_none()
        && w.value.starts_with('@') && !w.value.starts_with("@@"))
}

/// The byte offset of a tokenizer location (line and column count characters
/// from 1) in `sql`.
fn offset(sql: &str, at: Location) -> usize {
    let (mut line, mut column) = (1, 1);
    for (i, c) in sql.char_indices() {
        if (line, column) == (at.line, at.column) {
            return i;
        }
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    sql.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// White space runs folded, to compare rewritten statements.
    fn folded(s: Option<impl AsRef<str>>) -> Option<String> {
        s.map(|s| s.as_ref().split_whitespace().collect::<Vec<_>>().join(" "))
    }

    #[test]
    fn session_and_global_transaction_defaults() {
        let cases = [
            ("SET SESSION TRANSACTION READ ONLY", Some(Decision::Set)),
            (
                "set global transaction isolation level serializable",
                Some(Decision::Write),
            ),
            ("SET TRANSACTION READ ONLY", None),
            ("set  session  transaction read only", Some(Decision::Set)),
            ("SET LOCAL TRANSACTION READ WRITE", Some(Decision::Set)),
            ("SET transaction_isolation = 'READ-COMMITTED'", None),
            ("SET SESSION TRANSACTION READ ONLY; DROP TABLE t", None),
        ];
        for (sql, want) in cases {
            assert_eq!(quirk(sql), want, "{sql}");
        }
    }

    #[test]
    fn set_statement_yields_its_statement() {
        let cases = [
            (
                "SET STATEMENT max_statement_time=10 FOR SELECT 1",
                Some("SELECT 1"),
            ),
            (
                "set statement a=1, b='x' for UPDATE t SET k=1",
                Some("UPDATE t SET k=1"),
            ),
            (
                "SET STATEMENT a='for' FOR DELETE FROM t",
                Some("DELETE FROM t"),
            ),
            (
                "SET STATEMENT a=(SELECT 1 FOR UPDATE) FOR DO 1",
                Some("DO 1"),
            ),
            (
                "/* c */ SET STATEMENT a=1 FOR\nSELECT 1; SELECT 2",
                Some("SELECT 1; SELECT 2"),
            ),
            ("SET STATEMENT a=1", None),
            ("SET STATEMENT a=1; SELECT 1 FOR UPDATE", None),
            ("SET a=1", None),
            ("SELECT 1 FOR UPDATE", None),
        ];
        for (sql, want) in cases {
            assert_eq!(
                Tokens::of(sql).as_ref().and_then(set_statement_body),
                want,
                "{sql}"
            );
        }
    }

    #[test]
    fn do_becomes_a_select() {
        let cases = [
            ("DO GET_LOCK('job', 10)", Some("SELECT GET_LOCK('job', 10)")),
            ("do 1, @a := 2", Some("SELECT 1, @a := 2")),
            (
                "/* c */ DO\tRELEASE_LOCK('x')",
                Some("SELECT RELEASE_LOCK('x')"),
            ),
            ("`DO` 1", None),
            ("DOUBLE 1", None),
            ("SELECT 1", None),
        ];
        for (sql, want) in cases {
            assert_eq!(
                Tokens::of(sql).as_ref().and_then(do_as_select).as_deref(),
                want,
                "{sql}"
            );
        }
    }

    #[test]
    fn into_variables_are_cut_out() {
        let cases = [
            (
                "SELECT MAX(id) FROM t INTO @m",
                Some("SELECT MAX(id) FROM t"),
            ),
            (
                "SELECT a, b FROM t WHERE id = 1 INTO @a, @b FOR UPDATE",
                Some("SELECT a, b FROM t WHERE id = 1 FOR UPDATE"),
            ),
            ("(SELECT 1) INTO @x", Some("(SELECT 1)")),
            (
                "WITH w AS (SELECT 1 AS n) SELECT n FROM w INTO @n",
                Some("WITH w AS (SELECT 1 AS n) SELECT n FROM w"),
            ),
            ("SELECT c FROM t INTO OUTFILE '/tmp/x'", None),
            ("SELECT 1 INTO @@x", None),
            ("SELECT * FROM (SELECT 1 INTO @x) d", None),
            ("SELECT 1; SELECT 2 INTO @x", None),
            ("INSERT INTO @x VALUES (1)", None),
        ];
        for (sql, want) in cases {
            assert_eq!(
                folded(Tokens::of(sql).as_ref().and_then(without_into_variables)),
                folded(want),
                "{sql}"
            );
        }
    }

    #[test]
    fn server_wide_scopes_anywhere_in_a_set_list() {
        let cases = [
            ("SET PERSIST max_connections = 500", true),
            ("set persist_only innodb_log_file_size = 1", true),
            ("SET wait_timeout = 10, PERSIST max_connections = 500", true),
            ("SET @@persist.max_connections = 1", true),
            ("SET a = 1, @@GLOBAL.b = 2", true),
            ("SET a = 'persist'", false),
            ("SET a = global_value", false),
            ("SET a = f(1, global)", false),
            ("SET SESSION wait_timeout = 10", false),
            ("SET PASSWORD FOR 'u'@'h' = 'x'", false),
            ("SELECT 1, global", false),
        ];
        for (sql, want) in cases {
            assert_eq!(sets_server_scope(Tokens::of(sql).as_ref()), want, "{sql}");
        }
    }

    #[test]
    fn locations_become_byte_offsets() {
        let sql = "é\nab";
        assert_eq!(offset(sql, Location::new(1, 2)), 2);
        assert_eq!(offset(sql, Location::new(2, 2)), 4);
        assert_eq!(offset(sql, Location::new(3, 1)), sql.len());
    }
}
