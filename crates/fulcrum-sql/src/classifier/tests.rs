//! Unit tests of `classifier`.

use super::*;

fn pg() -> Classifier {
    Classifier::new(
        Dialect::Postgres,
        &ClassifierConfig {
            cache_size: 100,
            write_functions: vec!["audit_log".into()],
            read_only_functions: vec!["currval".into()],
            ..Default::default()
        },
    )
}

#[test]
fn unparsed_text_with_multibyte_characters_does_not_panic() {
    // fuzz/classify's crash input (first byte 0: PostgreSQL), passed as
    // the front ends pass text: lossy UTF-8. The statement does not
    // parse, so its effects come from `head_words`, which cut a
    // three-byte character in half.
    let input: &[u8] = &[
        0x00, 0x49, 0x4e, 0x53, 0x45, 0x52, 0x54, 0x20, 0x49, 0x4e, 0x54, 0x4f, 0x20, 0x74, 0xe0,
        0xa9, 0xbe, 0xab, 0x55, 0x45, 0x53, 0x20, 0x28, 0x24, 0x31, 0x29, 0x20, 0x4f, 0x4e, 0x20,
        0x43, 0x4f, 0x4e, 0x46, 0x4c, 0x49, 0x43, 0x54, 0x20, 0x44, 0x4f, 0x20, 0x4e, 0x4f, 0x54,
        0x48, 0x49, 0x4e, 0x00, 0x00, 0x00, 0x47,
    ];
    let text = String::from_utf8_lossy(&input[1..]);
    for dialect in [Dialect::Postgres, Dialect::MySql] {
        let c = Classifier::new(dialect, &ClassifierConfig::default());
        let _ = c.classify_unit(&text);
    }
}

#[test]
fn cache_hits_after_the_first_parse() {
    let c = pg();
    assert_eq!(c.classify("SELECT * FROM t WHERE id = 1"), Decision::Read);
    assert_eq!(c.classify("SELECT * FROM t WHERE id = 2"), Decision::Read);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.cached), (1, 1, 1));
}

#[test]
fn configured_function_lists_apply() {
    let c = pg();
    assert_eq!(c.classify("SELECT audit_log('x')"), Decision::Primary);
    assert_eq!(c.classify("SELECT currval('s')"), Decision::Read);
    assert_eq!(c.classify("SELECT nextval('s')"), Decision::Primary);
}

#[test]
fn hints_override_within_limits() {
    let c = pg();
    assert_eq!(
        c.classify("/* fulcrum:primary */ SELECT 1"),
        Decision::Primary
    );
    assert_eq!(
        c.classify("SELECT nextval('s') /* fulcrum:replica */"),
        Decision::Read
    );
    assert_eq!(
        c.classify("/* fulcrum:replica */ UPDATE t SET a = 1"),
        Decision::Write
    );
}

#[test]
fn unparsable_statements_are_unknown_and_counted() {
    let c = pg();
    // PostgreSQL: what Fulcrum cannot read pins its client (default-deny).
    assert_eq!(
        c.classify("SELEC 1"),
        Decision::Pin("statement Fulcrum cannot parse")
    );
    assert_eq!(c.stats().unparsed, 1);
    let my = Classifier::new(Dialect::MySql, &ClassifierConfig::default());
    assert_eq!(
        my.classify("SELEC 1"),
        Decision::Pin("statement Fulcrum cannot parse")
    );
    assert_eq!(
        my.classify("OPTIMIZE TABLE t"),
        Decision::Unknown,
        "maintenance its words prove plain"
    );
}

#[test]
fn statements_over_the_limit_are_not_parsed() {
    let c = Classifier::new(
        Dialect::Postgres,
        &ClassifierConfig {
            cache_size: 10,
            max_classify_bytes: 64,
            ..Default::default()
        },
    );
    let nested = format!("SELECT {}1{}", "(".repeat(100), ")".repeat(100));
    assert_eq!(c.classify(&nested), Decision::Unknown);
    let hinted = format!("/* fulcrum:primary */ {nested}");
    assert_eq!(c.classify(&hinted), Decision::Primary);
    let set = format!("SET app.blob = '{}'", "x".repeat(100));
    assert!(matches!(c.classify(&set), Decision::Pin(_)));
    let temp = format!("CREATE TEMP TABLE t AS SELECT {}", "1,".repeat(50));
    assert!(matches!(c.classify(&temp), Decision::Pin(_)));
    assert_eq!(
        c.classify("SELECT 1"),
        Decision::Read,
        "short ones still parse"
    );
    let s = c.stats();
    assert_eq!((s.oversized, s.unparsed, s.cached), (4, 0, 1));
    // A multi-byte character across the cut is no problem.
    let wide = format!("SELECT '{}'", "é".repeat(200));
    assert_eq!(c.classify(&wide), Decision::Unknown);
    // Only plainly one read or write is left to default_route.
    let pad = "x".repeat(100);
    for pinned in [
        format!("SELECT '{pad}'; SET search_path = leak"),
        format!("SELECT pg_advisory_lock(1), '{pad}'"),
        format!("SELECT set_config('app.t', '{pad}', false)"),
        format!("SELECT '{pad}' INTO TEMP copy"),
        format!("NOTIFY c, '{pad}'"),
    ] {
        assert!(matches!(c.classify(&pinned), Decision::Pin(_)), "{pinned}");
    }
    let insert = format!("INSERT INTO t VALUES ('{pad}')");
    assert_eq!(c.classify(&insert), Decision::Unknown);
}

#[test]
fn set_statements_are_not_cached() {
    let c = Classifier::new(
        Dialect::MySql,
        &ClassifierConfig {
            cache_size: 10,
            ..Default::default()
        },
    );
    assert_eq!(c.classify("SET autocommit = 1"), Decision::Set);
    assert_eq!(
        c.classify("SET autocommit = 0"),
        Decision::Pin("SET autocommit = 0")
    );
}

#[test]
fn unparsable_set_forms_are_still_session_statements() {
    let pg = Dialect::Postgres;
    assert_eq!(
        unparsed_session_statement("SET SCHEMA 'app'", pg, None),
        Some(Decision::Set)
    );
    assert_eq!(
        unparsed_session_statement("SET role TO r", pg, None),
        Some(Decision::Pin("SET ROLE"))
    );
    assert_eq!(
        unparsed_session_statement("SET x = 1; DROP TABLE t", pg, None),
        None
    );
    assert_eq!(unparsed_session_statement("SELEC 1", pg, None), None);
    let my = Dialect::MySql;
    assert_eq!(
        unparsed_session_statement("SET @x := 1", my, mysql::Tokens::of("SET @x := 1").as_ref()),
        Some(Decision::Pin("user variable"))
    );
    assert_eq!(
        unparsed_session_statement(
            "PREPARE s FROM 'SELECT 1'",
            my,
            mysql::Tokens::of("PREPARE s FROM 'SELECT 1'").as_ref()
        ),
        Some(Decision::Pin("SQL PREPARE"))
    );
    assert_eq!(
        unparsed_session_statement(
            "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT",
            my,
            mysql::Tokens::of("START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT").as_ref()
        ),
        Some(Decision::Begin { read_only: true })
    );
    assert_eq!(
        unparsed_session_statement(
            "RESET MASTER",
            my,
            mysql::Tokens::of("RESET MASTER").as_ref()
        ),
        None
    );
}

#[test]
fn unparsable_mysql_sets_of_the_server_or_an_account_are_writes() {
    let my = Dialect::MySql;
    let cases = [
        (
            "SET PASSWORD FOR 'u1'@'localhost' = PASSWORD('s')",
            Some(Decision::Write),
        ),
        (
            "SET DEFAULT ROLE app_role FOR 'u1'@'%'",
            Some(Decision::Write),
        ),
        ("SET DEFAULT ROLE ALL TO 'u1'@'%'", Some(Decision::Write)),
        ("SET PERSIST max_connections = 500", Some(Decision::Write)),
        (
            "SET PERSIST_ONLY max_connections = 500",
            Some(Decision::Write),
        ),
        (
            "SET wait_timeout = 10, PERSIST max_connections = 500",
            Some(Decision::Write),
        ),
        ("SET LOCAL wait_timeout := 10", Some(Decision::Set)),
        ("SET LOCAL @x := 1", Some(Decision::Pin("user variable"))),
        ("SET STATEMENT max_statement_time = 10", None),
    ];
    for (sql, want) in cases {
        assert_eq!(
            unparsed_session_statement(sql, my, mysql::Tokens::of(sql).as_ref()),
            want,
            "{sql}"
        );
    }
    let pg = Dialect::Postgres;
    assert_eq!(
        unparsed_session_statement("SET LOCAL x TO 1", pg, None),
        Some(Decision::Txn)
    );
}

#[test]
fn mysql_forms_route_as_the_statement_they_carry() {
    let c = Classifier::new(Dialect::MySql, &ClassifierConfig::default());
    let into = Decision::Pin("SELECT ... INTO @variable");
    let lock = Decision::Pin("session lock function");
    let cases = [
        (
            "SET STATEMENT max_statement_time=10 FOR SELECT c FROM t",
            Decision::Read,
        ),
        (
            "SET STATEMENT a=1, b=2 FOR UPDATE t SET k = 1",
            Decision::Write,
        ),
        ("SET STATEMENT a=1 FOR SELECT GET_LOCK('j', 1)", lock),
        (
            "SET STATEMENT a=1 FOR SELECT 1 /* fulcrum:primary */",
            Decision::Primary,
        ),
        ("DO GET_LOCK('job', 10)", lock),
        ("DO 1, RELEASE_LOCK('job')", lock),
        ("DO @a := 1", Decision::Pin("user variable")),
        ("SELECT MAX(id) FROM t INTO @m", into),
        ("SELECT c FROM t WHERE id = 1 INTO @c FOR UPDATE", into),
        ("SELECT c FROM t INTO @c LOCK IN SHARE MODE", into),
        (
            "SELECT @n := 1 FROM t INTO @m",
            Decision::Pin("user variable"),
        ),
    ];
    for (sql, want) in cases {
        assert_eq!(c.classify(sql), want, "{sql}");
    }
    assert_eq!(c.stats().unparsed, 0);
    // Other DOs, and SET STATEMENT without its statement, are not read:
    // default-deny pins them (and they are counted).
    let unparsed = Decision::Pin("statement Fulcrum cannot parse");
    assert_eq!(c.classify("DO SLEEP(1)"), unparsed);
    assert_eq!(c.classify("SET STATEMENT a=1"), unparsed);
    assert_eq!(c.classify("SET STATEMENT a=1 FOR SELEC 1"), unparsed);
    // What its words prove plain keeps default_route.
    assert_eq!(
        c.classify("SELECT c FROM t WHERE id = 1 LOCK IN SHARE MODE"),
        Decision::Unknown
    );
    assert_eq!(c.classify("SELECT NEXT VALUE FOR s"), unparsed);
    assert_eq!(c.classify("HANDLER t OPEN"), unparsed);
    assert_eq!(c.classify("XA START 'x'"), unparsed);
    assert_eq!(c.stats().unparsed, 7);
}

#[test]
fn mysql_executable_comments_are_parsed() {
    assert_eq!(
        open_executable_comments("/*!40101 SET NAMES utf8 */").trim(),
        "SET NAMES utf8"
    );
    assert_eq!(
        open_executable_comments("SELECT 1 /* c */"),
        "SELECT 1 /* c */"
    );
}

#[test]
fn one_pass_gives_key_comments_and_may_commit_from_the_cache_too() {
    let c = pg();
    let first = c.classify_unit("SELECT abalance FROM a WHERE aid = 1");
    let hit = c.classify_unit("SELECT abalance FROM a WHERE aid = 2");
    assert_eq!(c.stats().hits, 1, "the second text is a cache hit");
    assert_eq!(first.key, hit.key, "one fingerprint for both");
    assert_eq!(
        hit.key,
        crate::fingerprint("SELECT abalance FROM a WHERE aid = 2", Dialect::Postgres),
        "the key is the digest statistics' fingerprint"
    );
    assert!(!hit.comments && !hit.may_commit);
    let commit = c.classify_unit("COMMIT");
    assert!(commit.may_commit);
    assert!(
        c.classify_unit("COMMIT").may_commit,
        "cached with the decision"
    );
    // A hint is only read when the text has a comment, and is then applied
    // per text even on a cache hit.
    let plain = c.classify_unit("SELECT 1 FROM t");
    let hinted = c.classify_unit("/* fulcrum:primary */ SELECT 1 FROM t");
    assert_eq!(plain.key, hinted.key);
    assert!(!plain.comments && hinted.comments);
    assert_eq!(plain.decision, Decision::Read);
    assert_eq!(hinted.decision, Decision::Primary);
    assert!(c.classify_unit("SELECT 1 -- fulcrum:primary").comments);
}

#[test]
fn a_hit_is_shared_and_a_hinted_text_gets_its_own_copy() {
    let c = pg();
    let first = c.classify_shared("SELECT abalance FROM a WHERE aid = 1");
    let hit = c.classify_shared("SELECT abalance FROM a WHERE aid = 2");
    assert!(
        Arc::ptr_eq(&first, &hit),
        "a hit is the cached classification"
    );
    assert_eq!(
        *hit,
        c.classify_unit("SELECT abalance FROM a WHERE aid = 3")
    );
    let hinted = c.classify_shared("/* fulcrum:primary */ SELECT abalance FROM a WHERE aid = 4");
    assert!(!Arc::ptr_eq(&hinted, &hit));
    assert_eq!(
        (hinted.decision, hinted.comments),
        (Decision::Primary, true)
    );
    assert_eq!(
        hinted.cache.reads, None,
        "never answered from the result cache"
    );
    // The cached one is untouched by the hint.
    let after = c.classify_shared("SELECT abalance FROM a WHERE aid = 5");
    assert!(Arc::ptr_eq(&after, &first));
    assert_eq!((after.decision, after.comments), (Decision::Read, false));
    assert!(after.cache.reads.is_some());
    assert_eq!(after.key, hinted.key);
}
