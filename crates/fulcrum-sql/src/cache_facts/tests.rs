//! Unit tests of `cache_facts`: a table of statements and their facts in
//! both dialects, through `Classifier::classify_unit`, and the routing
//! corpus run through it.

use super::*;
use crate::classifier::{Classifier, ClassifierConfig};

use Dialect::{MySql as My, Postgres as Pg};

/// A case's expected writes.
#[derive(Debug)]
enum W {
    N,
    T(&'static [&'static str]),
    E,
}

type Case = (
    Dialect,
    &'static str,
    Option<&'static [&'static str]>,
    Option<&'static [&'static str]>,
    W,
);

const NONE: Option<&[&str]> = None;

fn classifier(dialect: Dialect) -> Classifier {
    Classifier::new(
        dialect,
        &ClassifierConfig {
            write_functions: vec!["audit_log".into()],
            ..Default::default()
        },
    )
}

fn names(v: &Option<Arc<[Arc<str>]>>) -> Option<Vec<&str>> {
    v.as_ref().map(|l| l.iter().map(|s| &**s).collect())
}

fn check(cases: &[Case]) {
    let (pg, my) = (classifier(Pg), classifier(My));
    let mut wrong = Vec::new();
    for (dialect, sql, reads, calls, writes) in cases {
        let c = if *dialect == Pg { &pg } else { &my };
        let got = c.classify_unit(sql).cache;
        let want_writes = match writes {
            W::N => Writes::Nothing,
            W::T(t) => Writes::Tables(t.iter().map(|s| Arc::from(*s)).collect()),
            W::E => Writes::Everything,
        };
        if names(&got.reads) != reads.map(|r| r.to_vec())
            || names(&got.calls) != calls.map(|r| r.to_vec())
            || got.writes != want_writes
        {
            wrong.push(format!(
                "{dialect:?} {sql}\n   want reads {reads:?} calls {calls:?} writes {writes:?}\n   got  {got:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn reads_kept_with_their_relations() {
    check(&[
        (Pg, "SELECT * FROM t WHERE id = 1", Some(&["t"]), NONE, W::N),
        (My, "SELECT * FROM t WHERE id = 1", Some(&["t"]), NONE, W::N),
        (Pg, "SELECT a.x, b.y FROM b JOIN a ON a.id = b.id LEFT JOIN a AS a2 ON true", Some(&["a", "b"]), NONE, W::N),
        (Pg, "SELECT * FROM t WHERE id IN (SELECT tid FROM u WHERE EXISTS (SELECT 1 FROM v))", Some(&["t", "u", "v"]), NONE, W::N),
        (Pg, "SELECT (SELECT max(x) FROM u) AS m FROM t", Some(&["t", "u"]), NONE, W::N),
        (Pg, "SELECT x FROM a UNION SELECT x FROM b EXCEPT SELECT x FROM c", Some(&["a", "b", "c"]), NONE, W::N),
        (My, "SELECT x FROM a UNION ALL SELECT x FROM b", Some(&["a", "b"]), NONE, W::N),
        (Pg, "WITH x AS (SELECT * FROM t) SELECT * FROM x JOIN u ON true", Some(&["t", "u"]), NONE, W::N),
        (My, "WITH x AS (SELECT * FROM t) SELECT * FROM x", Some(&["t"]), NONE, W::N),
        // Not RECURSIVE: a CTE body sees only the CTEs before it; its own
        // name there is the table.
        (Pg, "WITH t AS (SELECT * FROM t) SELECT * FROM t", Some(&["t"]), NONE, W::N),
        (Pg, "WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a, b", Some(&["b"]), NONE, W::N),
        (Pg, "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT * FROM r, t", Some(&["t"]), NONE, W::N),
        // A CTE name in an inner scope does not hide the table outside it.
        (Pg, "SELECT * FROM x WHERE id IN (WITH x AS (SELECT 1 AS id) SELECT id FROM x)", Some(&["x"]), NONE, W::N),
        (Pg, "SELECT * FROM \"Foo\".Bar", Some(&["foo.bar"]), NONE, W::N),
        (Pg, "SELECT * FROM \"Users\" u JOIN public.\"Post\" p ON p.uid = u.id", Some(&["public.post", "users"]), NONE, W::N),
        (My, "SELECT * FROM `Shop`.`Orders`", Some(&["shop.orders"]), NONE, W::N),
        (Pg, "SELECT * FROM db.s.t", Some(&["s.t"]), NONE, W::N),
        (Pg, "SELECT * FROM t, LATERAL (SELECT * FROM u WHERE u.id = t.id) l", Some(&["t", "u"]), NONE, W::N),
        (Pg, "SELECT * FROM t UNION TABLE u", Some(&["t", "u"]), NONE, W::N),
        (My, "SELECT * FROM t /* fulcrum:primary */", NONE, NONE, W::N),
        (Pg, "SELECT * FROM (VALUES (1), (2)) v(x) JOIN t ON t.id = v.x", Some(&["t"]), NONE, W::N),
        (Pg, "SELECT lower(name), count(*), coalesce(max(x), 0) FROM t GROUP BY 1", Some(&["t"]), NONE, W::N),
        (My, "SELECT ifnull(x, 0), if(y > 1, 'a', 'b'), concat(a, b) FROM t", Some(&["t"]), NONE, W::N),
        (Pg, "SELECT CAST(x AS text), substring(s FROM 2), extract(year FROM d) FROM t", Some(&["t"]), NONE, W::N),
        // Calls no list knows: kept if the catalog vouches for them.
        (Pg, "SELECT price(id), concat(a, b), to_char(d, 'YYYY') FROM t", Some(&["t"]), Some(&["concat", "price", "to_char"]), W::N),
        (Pg, "SELECT s.total(x) FROM t", Some(&["t"]), Some(&["total"]), W::N),
        (My, "SELECT shop.price(id) FROM t", Some(&["t"]), Some(&["price"]), W::N),
    ]);
}

#[test]
fn reads_never_kept() {
    check(&[
        (Pg, "SELECT 1", NONE, NONE, W::N),
        (My, "SELECT 1 + 1", NONE, NONE, W::N),
        (Pg, "WITH x AS (SELECT 1) SELECT * FROM x", NONE, NONE, W::N),
        (Pg, "SELECT * FROM pg_catalog.pg_class", NONE, NONE, W::N),
        (Pg, "SELECT * FROM pg_stat_activity", NONE, NONE, W::N),
        (
            Pg,
            "SELECT * FROM information_schema.tables",
            NONE,
            NONE,
            W::N,
        ),
        (Pg, "SELECT * FROM pg_temp.scratch", NONE, NONE, W::N),
        (
            My,
            "SELECT * FROM information_schema.processlist",
            NONE,
            NONE,
            W::N,
        ),
        (
            My,
            "SELECT * FROM performance_schema.threads",
            NONE,
            NONE,
            W::N,
        ),
        (My, "SELECT * FROM mysql.user", NONE, NONE, W::N),
        (My, "SELECT * FROM sys.session", NONE, NONE, W::N),
        (Pg, "SELECT * FROM t WHERE d > now()", NONE, NONE, W::N),
        (Pg, "SELECT random() FROM t", NONE, NONE, W::N),
        (
            My,
            "SELECT * FROM t ORDER BY rand() LIMIT 1",
            NONE,
            NONE,
            W::N,
        ),
        (Pg, "SELECT current_user, x FROM t", NONE, NONE, W::N),
        (Pg, "SELECT current_timestamp FROM t", NONE, NONE, W::N),
        (Pg, "SELECT localtimestamp FROM t", NONE, NONE, W::N),
        (Pg, "SELECT current_date FROM t", NONE, NONE, W::N),
        (Pg, "SELECT user FROM t", NONE, NONE, W::N),
        (My, "SELECT current_timestamp FROM t", NONE, NONE, W::N),
        (My, "SELECT current_user FROM t", NONE, NONE, W::N),
        (My, "SELECT localtimestamp FROM t", NONE, NONE, W::N),
        (My, "SELECT current_date FROM t", NONE, NONE, W::N),
        (My, "SELECT database(), x FROM t", NONE, NONE, W::N),
        (My, "SELECT version() FROM t", NONE, NONE, W::N),
        (
            Pg,
            "SELECT current_setting('search_path') FROM t",
            NONE,
            NONE,
            W::N,
        ),
        (Pg, "SELECT pg_size_pretty(x) FROM t", NONE, NONE, W::N),
        (
            Pg,
            "SELECT * FROM t WHERE d > 'now'::timestamptz",
            NONE,
            NONE,
            W::N,
        ),
        (
            Pg,
            "SELECT * FROM t WHERE d = date 'today'",
            NONE,
            NONE,
            W::N,
        ),
        (
            Pg,
            "SELECT * FROM generate_series(1, 3) g JOIN t ON t.id = g",
            NONE,
            NONE,
            W::N,
        ),
        (
            Pg,
            "SELECT * FROM t, unnest(t.tags) AS tag",
            NONE,
            NONE,
            W::N,
        ),
        (
            Pg,
            "SELECT * FROM t TABLESAMPLE SYSTEM (10)",
            NONE,
            NONE,
            W::N,
        ),
        (Pg, "SELECT * FROM t FOR UPDATE", NONE, NONE, W::N),
        (
            Pg,
            "SELECT * FROM t WHERE id IN (SELECT id FROM u FOR SHARE)",
            NONE,
            NONE,
            W::N,
        ),
        // sqlparser 0.63 does not parse these: default-deny.
        (Pg, "SELECT * FROM t FOR NO KEY UPDATE", NONE, NONE, W::E),
        (Pg, "SELECT * FROM t FOR KEY SHARE", NONE, NONE, W::E),
        (My, "SELECT * FROM t FOR UPDATE", NONE, NONE, W::N),
        (My, "SELECT * FROM t LOCK IN SHARE MODE", NONE, NONE, W::E),
        (
            My,
            "SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 10",
            NONE,
            NONE,
            W::N,
        ),
        (My, "SELECT @x FROM t", NONE, NONE, W::N),
        (My, "SELECT * FROM t WHERE id = @id", NONE, NONE, W::N),
        (My, "SELECT @@sql_mode, x FROM t", NONE, NONE, W::N),
        (Pg, "SELECT x INTO newt FROM t", NONE, NONE, W::E),
        (Pg, "SELECT \"Lower\"(x) FROM t", NONE, NONE, W::N),
        (Pg, "SELECT * FROM t; SELECT * FROM u", NONE, NONE, W::N),
        (Pg, "EXPLAIN SELECT * FROM t", NONE, NONE, W::N),
    ]);
}

#[test]
fn what_writes_change() {
    check(&[
        (Pg, "INSERT INTO t (a) VALUES (1)", NONE, NONE, W::T(&["t"])),
        (Pg, "INSERT INTO s.\"T\" (a) VALUES (1) RETURNING id", NONE, NONE, W::T(&["s.t"])),
        (Pg, "INSERT INTO hist SELECT * FROM t WHERE d < now()", NONE, NONE, W::T(&["hist"])),
        (Pg, "INSERT INTO t (id, n) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = t.n + excluded.n", NONE, NONE, W::T(&["t"])),
        (Pg, "INSERT INTO t (id, made) VALUES (nextval('s'), clock_timestamp())", NONE, NONE, W::T(&["t"])),
        (Pg, "INSERT INTO t (a) VALUES (audit_log(1))", NONE, NONE, W::E),
        (Pg, "INSERT INTO t SELECT my_fn(x) FROM u", NONE, NONE, W::E),
        (Pg, "UPDATE t SET n = u.n FROM u WHERE u.id = t.id", NONE, NONE, W::T(&["t"])),
        (Pg, "UPDATE t SET n = n + 1 WHERE id IN (SELECT id FROM u WHERE f(u.x))", NONE, NONE, W::E),
        (Pg, "DELETE FROM t USING u WHERE u.id = t.id", NONE, NONE, W::T(&["t"])),
        (Pg, "MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN UPDATE SET n = u.n WHEN NOT MATCHED THEN INSERT (id, n) VALUES (u.id, u.n)", NONE, NONE, W::T(&["t"])),
        (Pg, "TRUNCATE a, s.b", NONE, NONE, W::T(&["a", "s.b"])),
        (Pg, "TRUNCATE a CASCADE", NONE, NONE, W::E),
        (Pg, "COPY t FROM STDIN", NONE, NONE, W::T(&["t"])),
        (Pg, "COPY t TO STDOUT", NONE, NONE, W::N),
        (Pg, "COPY (SELECT * FROM t) TO STDOUT", NONE, NONE, W::N),
        (Pg, "WITH moved AS (DELETE FROM a WHERE x < 0 RETURNING *) INSERT INTO b SELECT * FROM moved", NONE, NONE, W::T(&["a", "b"])),
        (Pg, "WITH up AS (UPDATE t SET n = 0 RETURNING id) SELECT * FROM up", NONE, NONE, W::T(&["t"])),
        (Pg, "INSERT INTO a VALUES (1); UPDATE b SET x = 1; DELETE FROM a", NONE, NONE, W::T(&["a", "b"])),
        (Pg, "BEGIN; INSERT INTO a VALUES (1); COMMIT", NONE, NONE, W::T(&["a"])),
        (Pg, "INSERT INTO a VALUES (1); CREATE INDEX i ON b (x)", NONE, NONE, W::E),
        (Pg, "EXPLAIN ANALYZE UPDATE t SET n = 1", NONE, NONE, W::T(&["t"])),
        (Pg, "EXPLAIN UPDATE t SET n = 1", NONE, NONE, W::N),
        (My, "INSERT INTO t (id, n) VALUES (1, 1) ON DUPLICATE KEY UPDATE n = VALUES(n) + 1", NONE, NONE, W::T(&["t"])),
        (My, "REPLACE INTO t (id, n) VALUES (1, now())", NONE, NONE, W::T(&["t"])),
        (My, "INSERT INTO t (id, u) VALUES (1, uuid())", NONE, NONE, W::T(&["t"])),
        (My, "UPDATE a JOIN b ON a.id = b.id SET a.x = b.x", NONE, NONE, W::T(&["a", "b"])),
        (My, "UPDATE shop.a AS x JOIN b ON x.id = b.id SET x.n = 1", NONE, NONE, W::T(&["b", "shop.a"])),
        (My, "DELETE a, b FROM a JOIN b ON a.id = b.id WHERE a.x = 1", NONE, NONE, W::T(&["a", "b"])),
        (My, "DELETE FROM t WHERE id = 1 LIMIT 1", NONE, NONE, W::T(&["t"])),
        (My, "UPDATE t SET n = my_fn(n)", NONE, NONE, W::E),
        (My, "INSERT INTO t VALUES (@x)", NONE, NONE, W::T(&["t"])),
    ]);
}

#[test]
fn what_changes_nothing_or_everything() {
    check(&[
        (Pg, "SET search_path = app", NONE, NONE, W::N),
        (Pg, "SHOW search_path", NONE, NONE, W::N),
        (Pg, "BEGIN", NONE, NONE, W::N),
        (Pg, "COMMIT", NONE, NONE, W::N),
        (Pg, "SAVEPOINT s", NONE, NONE, W::N),
        (Pg, "LISTEN ch", NONE, NONE, W::N),
        (Pg, "NOTIFY ch", NONE, NONE, W::N),
        (Pg, "DISCARD ALL", NONE, NONE, W::N),
        (Pg, "DEALLOCATE p", NONE, NONE, W::N),
        (Pg, "VACUUM t", NONE, NONE, W::N),
        (Pg, "ANALYZE t", NONE, NONE, W::N),
        (
            Pg,
            "LOCK TABLE t IN ACCESS EXCLUSIVE MODE",
            NONE,
            NONE,
            W::N,
        ),
        (
            Pg,
            "SELECT * FROM t WHERE id = 1 FOR UPDATE",
            NONE,
            NONE,
            W::N,
        ),
        (Pg, "SELECT nextval('s')", NONE, NONE, W::N),
        (Pg, "SELECT audit_log(1)", NONE, NONE, W::E),
        (Pg, "EXECUTE p(1)", NONE, NONE, W::E),
        (Pg, "CALL do_things()", NONE, NONE, W::E),
        (Pg, "CREATE TABLE n (id int)", NONE, NONE, W::E),
        (Pg, "ALTER TABLE t ADD COLUMN c int", NONE, NONE, W::E),
        (Pg, "DROP TABLE t", NONE, NONE, W::E),
        (Pg, "GRANT SELECT ON t TO bob", NONE, NONE, W::E),
        (Pg, "COMMENT ON TABLE t IS 'x'", NONE, NONE, W::E),
        (Pg, "DO $$ BEGIN PERFORM 1; END $$", NONE, NONE, W::E),
        (My, "SET NAMES utf8mb4", NONE, NONE, W::N),
        (My, "SET @x = 1", NONE, NONE, W::N),
        (My, "SET sql_mode = ''", NONE, NONE, W::N),
        // A global setting changes what other sessions read (time_zone).
        (My, "SET GLOBAL time_zone = '+00:00'", NONE, NONE, W::E),
        (
            My,
            "SET @@global.max_connections = 10, wait_timeout = 5",
            NONE,
            NONE,
            W::E,
        ),
        (My, "SET @x = (SELECT my_fn(1))", NONE, NONE, W::E),
        (My, "USE shop", NONE, NONE, W::N),
        (My, "LOCK TABLES t WRITE", NONE, NONE, W::N),
        (My, "START TRANSACTION", NONE, NONE, W::N),
        (
            My,
            "SELECT * FROM t WHERE id = 1 FOR UPDATE",
            NONE,
            NONE,
            W::N,
        ),
        (My, "SELECT last_insert_id()", NONE, NONE, W::N),
        (My, "CREATE TABLE n (id int)", NONE, NONE, W::E),
        (My, "RENAME TABLE a TO b", NONE, NONE, W::E),
        (My, "CALL p()", NONE, NONE, W::E),
    ]);
}

/// Statements whose kind changes no table though the router sends them
/// to the primary as writes (docs/routing.md, "Cache").
fn changes_no_table(sql: &str) -> bool {
    let lower = sql.trim_start().to_ascii_lowercase();
    [
        "vacuum", "analyze", "lock ", "explain", "copy", "listen", "notify", "prepare", "set ",
        "select",
    ]
    .iter()
    .any(|w| lower.starts_with(w))
}

/// Every corpus statement: no panic, and every `write` changes something
/// (unless its kind changes no table: those are listed and checked to be
/// few).
#[test]
fn corpus_writes_never_change_nothing() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/corpus");
    for (file, dialect) in [("postgres.txt", Pg), ("mysql.txt", My)] {
        let path = format!("{dir}/{file}");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let c = classifier(dialect);
        let (mut cases, mut writes, mut wrong, mut exempt) = (0, 0, Vec::new(), Vec::new());
        for line in text.lines().map(str::trim) {
            let Some((label, sql)) = line.split_once(" | ") else {
                continue;
            };
            if line.starts_with('#') {
                continue;
            }
            let sql = sql.replace("\\n", "\n");
            cases += 1;
            let got = c.classify_unit(&sql).cache;
            if got.reads.is_some() {
                assert_eq!(label.trim(), "read", "{file}: kept but not a read: {sql}");
            }
            if label.trim() == "write" {
                writes += 1;
                if got.writes == Writes::Nothing {
                    if changes_no_table(&sql) {
                        exempt.push(sql.clone());
                    } else {
                        wrong.push(sql.clone());
                    }
                }
            }
        }
        assert!(
            cases > 500 && writes > 100,
            "{file}: {cases} cases, {writes} writes"
        );
        assert!(
            wrong.is_empty(),
            "{file}: writes that change nothing:\n{}",
            wrong.join("\n")
        );
        assert!(exempt.len() < 20, "{file}: {exempt:#?}");
        eprintln!("{file}: {cases} cases, {writes} writes, exempt {exempt:#?}");
    }
}
