//! Leaks found by probing a real Fulcrum with two clients on one server
//! connection (`tests/postgres/pg_isolation/probes.rs`,
//! `tests/mysql/my_proxy/probes.rs`), each pinned down here at the
//! classifier: what the unit now pins, tracks or lists for the catalog.

use crate::{Classifier, ClassifierConfig, Decision, Dialect, Effect};

fn pg() -> Classifier {
    Classifier::new(Dialect::Postgres, &ClassifierConfig::default())
}

fn my() -> Classifier {
    Classifier::new(Dialect::MySql, &ClassifierConfig::default())
}

fn unproven(c: &Classifier, sql: &str) -> Vec<String> {
    c.classify_unit(sql)
        .unproven
        .map(|f| f.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default()
}

fn sets(c: &Classifier, sql: &str) -> Vec<String> {
    c.classify_unit(sql)
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Set { stmt, .. } => Some(stmt.clone()),
            _ => None,
        })
        .collect()
}

/// `public.lower(1)` ran a user's function that called `set_config`: a
/// qualified name outside `pg_catalog` is never a built-in, whatever its
/// last part; MySQL's built-ins are never qualified.
#[test]
fn a_qualified_namesake_of_a_built_in_is_a_users_function() {
    let pg = pg();
    assert_eq!(unproven(&pg, "SELECT public.lower(1)"), ["lower"]);
    assert_eq!(
        unproven(&pg, "SELECT s.set_config('a', 'b', false)"),
        ["set_config"]
    );
    assert_eq!(unproven(&pg, "SELECT s.nextval(1)"), ["nextval"]);
    assert_eq!(
        unproven(&pg, "SELECT \"MySchema\".pg_advisory_lock(1)"),
        ["pg_advisory_lock"]
    );
    for sql in [
        "SELECT pg_catalog.lower('x'), PG_CATALOG.upper('y')",
        "SELECT \"pg_catalog\".now()",
        "SELECT pg_catalog.set_config('a', 'b', false)",
        "SELECT lower('x'), count(*) FROM t",
    ] {
        assert!(unproven(&pg, sql).is_empty(), "{sql}");
    }
    assert_eq!(
        unproven(&pg, "SELECT \"PG_CATALOG\".lower('x')"),
        ["lower"],
        "a quoted schema is case-sensitive"
    );
    let my = my();
    assert_eq!(unproven(&my, "SELECT app.lower(1)"), ["lower"]);
    assert!(unproven(&my, "SELECT LOWER('x'), NOW()").is_empty());
}

/// `SELECT * FROM set_config('my.v', '1', false)` set the value for the
/// next client: a call in the FROM list is a `SET` as in the select list.
#[test]
fn set_config_in_the_from_list_is_a_set() {
    let pg = pg();
    assert_eq!(
        sets(&pg, "SELECT * FROM set_config('my.v', '1', false)"),
        ["SET my.v = '1'"]
    );
    assert_eq!(
        sets(
            &pg,
            "SELECT x FROM pg_catalog.set_config('my.v', '2', false) AS x"
        ),
        ["SET my.v = '2'"]
    );
    let u = pg.classify_unit("SELECT * FROM set_config(n, 'A', false), (VALUES ('a.b')) v(n)");
    assert!(
        u.effects.iter().any(|e| matches!(e, Effect::Pin(_))),
        "a name that is not a literal pins: {u:?}"
    );
    assert!(sets(&pg, "SELECT * FROM set_config('my.v', '1', true)").is_empty());
}

/// `set_config('search_path', 'lps, public', false)` was replayed as
/// `SET search_path = 'lps, public'`: one schema named `lps, public`, so
/// the client lost its own path. List settings replay element by element.
#[test]
fn a_list_settings_value_is_replayed_element_by_element() {
    let pg = pg();
    let one = |sql: &str| sets(&pg, sql).pop().unwrap_or_default();
    assert_eq!(
        one("SELECT set_config('search_path', 'lps, public', false)"),
        "SET search_path = 'lps', 'public'"
    );
    assert_eq!(
        one("SELECT set_config('search_path', 'App,\"My \"\"S\"\", x\",$user', false)"),
        "SET search_path = 'app', 'My \"S\", x', '$user'"
    );
    assert_eq!(
        one("SELECT set_config('temp_tablespaces', 'Fast', false)"),
        "SET temp_tablespaces = 'fast'"
    );
    // Not a list PostgreSQL would take, or not ASCII: not replayed.
    for sql in [
        "SELECT set_config('search_path', 'a b', false)",
        "SELECT set_config('search_path', 'a,,b', false)",
        "SELECT set_config('search_path', '\"a', false)",
        "SELECT set_config('search_path', 'Ä', false)",
    ] {
        let u = pg.classify_unit(sql);
        assert!(
            u.effects.iter().any(|e| matches!(e, Effect::Pin(_))),
            "{sql}: {u:?}"
        );
    }
    // Other settings keep their value whole.
    assert_eq!(
        one("SELECT set_config('datestyle', 'ISO, MDY', false)"),
        "SET datestyle = 'ISO, MDY'"
    );
    assert_eq!(
        crate::set_config_statement("search_path", "").map(|s| s.1),
        Some("SET search_path = ''".into())
    );
}

/// `CREATE FUNCTION f() ...; SELECT f()` in one query: the catalog read
/// before it said `f` was no user function, so the call went unpinned.
#[test]
fn a_function_defined_and_called_in_one_unit_pins() {
    let pg = pg();
    for sql in [
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$; SELECT f()",
        "CREATE OR REPLACE FUNCTION public.g() RETURNS int LANGUAGE sql AS 'SELECT 1'; \
         SELECT * FROM t WHERE a = g()",
    ] {
        assert_eq!(
            pg.classify(sql),
            Decision::Pin("function defined and called in one unit"),
            "{sql}"
        );
    }
    assert_eq!(
        pg.classify("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$"),
        Decision::Write,
        "a definition alone"
    );
    assert_eq!(
        pg.classify("CREATE TABLE t (a int); SELECT lower('x')"),
        Decision::Write,
        "no definition"
    );
}

/// MySQL: `SELECT @`v` := 1` (sqlparser reads a placeholder) and
/// `SELECT LAST_INSERT_ID(42)` left session state without a pin.
#[test]
fn mysql_quoted_user_variables_and_last_insert_id_expr_pin() {
    let my = my();
    assert_eq!(
        my.classify("SELECT @`v` := 1"),
        Decision::Pin("user variable")
    );
    assert_eq!(
        my.classify("SELECT LAST_INSERT_ID(42)"),
        Decision::Pin("LAST_INSERT_ID(expr)")
    );
    assert_eq!(
        my.classify("SELECT id FROM t WHERE id = last_insert_id(id + 1)"),
        Decision::Pin("LAST_INSERT_ID(expr)")
    );
    assert_eq!(my.classify("SELECT LAST_INSERT_ID()"), Decision::Primary);
    assert_eq!(my.classify("SELECT ?"), Decision::Read);
}

/// `SET search_path TO 'pg_temp', 'public'` (or `set_config` with that
/// value), then a plain `CREATE TABLE t`: `t` was a temporary table, and
/// the next client on the connection saw it. A search path that names
/// `pg_temp` pins, in whatever form it is set.
#[test]
fn a_search_path_naming_pg_temp_pins() {
    let pg = pg();
    for sql in [
        "SET search_path TO 'pg_temp', 'public'",
        "SET search_path = 'PG_TEMP_3'",
        "SET SESSION search_path = 'x', 'pg_temp'",
        "SELECT set_config('search_path', 'pg_temp, public', false)",
        "SELECT set_config('search_path', 'PG_TEMP', false)",
        // Escapes spell it too; a transaction-local path lasts long enough.
        "SET search_path = E'pg\\x5ftemp', public",
        "SET search_path = U&'pg\\005ftemp'",
        "SET LOCAL search_path TO 'pg_temp'",
        "SELECT set_config('search_path', 'pg_temp', true)",
        "SELECT set_config('search_path', $1, true)",
        "SELECT set_config(n, 'pg_temp', true) FROM (VALUES ('search_path')) v(n)",
    ] {
        let u = pg.classify_unit(sql);
        assert!(
            u.effects.iter().any(
                |e| matches!(e, Effect::Pin(crate::effects::TEMP_SEARCH_PATH))
                    || matches!(e, Effect::Pin("set_config"))
            ),
            "{sql}: {u:?}"
        );
        assert!(sets(&pg, sql).is_empty(), "{sql}");
    }
    assert!(
        pg.classify_unit("SELECT set_config('search_path', 'app', true)")
            .effects
            .is_empty(),
        "a local path without pg_temp: nothing"
    );
    let u = pg.classify_unit("SET LOCAL SCHEMA 'pg_temp'");
    assert!(
        matches!(u.decision, Decision::Pin(_))
            || u.effects.iter().any(|e| matches!(e, Effect::Pin(_))),
        "{u:?}"
    );
    assert_eq!(
        crate::effects::of_words("SET SCHEMA 'pg_temp'"),
        Some(Effect::Pin(crate::effects::TEMP_SEARCH_PATH))
    );
    assert!(crate::set_config_statement("search_path", "pg_temp").is_none());
    assert_eq!(
        sets(&pg, "SET search_path = 'app', 'public'"),
        ["SET search_path = 'app', 'public'"]
    );
}
