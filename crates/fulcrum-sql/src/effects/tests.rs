//! The session effects the classifier reports, through its public entry
//! point (parsed and unparsed forms alike).

use super::*;
use crate::{Classifier, ClassifierConfig, Dialect};

fn pg() -> Classifier {
    Classifier::new(
        Dialect::Postgres,
        &ClassifierConfig {
            cache_size: 100,
            ..Default::default()
        },
    )
}

fn effects(s: &str) -> Vec<Effect> {
    pg().classify_unit(s).effects.to_vec()
}

fn set(key: &str, stmt: &str) -> Effect {
    Effect::Set {
        key: key.into(),
        stmt: stmt.into(),
    }
}

#[test]
fn plain_statements_have_no_effects() {
    assert!(effects("SELECT abalance FROM pgbench_accounts WHERE aid = 1").is_empty());
    assert!(effects("UPDATE t SET a = 1").is_empty());
    assert!(effects("insert into t values ('SET x = 1; RESET ALL')").is_empty());
    // Default-deny: what cannot be read may leave anything: it pins.
    assert_eq!(
        effects("SELEC 1"),
        vec![Effect::Pin("statement Fulcrum cannot parse")]
    );
}

#[test]
fn set_forms() {
    assert_eq!(
        effects("SET search_path TO app, public"),
        vec![set("search_path", "SET search_path TO app, public")]
    );
    assert_eq!(
        effects("  /* c */ set SESSION statement_timeout = '5s';"),
        vec![set(
            "statement_timeout",
            "set SESSION statement_timeout = '5s'"
        )]
    );
    let key = |s: &str| match effects(s).as_slice() {
        [Effect::Set { key, .. }] => key.clone(),
        other => panic!("{s}: {other:?}"),
    };
    assert_eq!(key("SET TIME ZONE 'UTC'"), "timezone");
    assert_eq!(key("SET NAMES 'UTF8'"), "client_encoding");
    assert_eq!(key("SET SCHEMA 'app'"), "search_path");
    assert_eq!(key("SET \"MyApp.Tenant\" = 'x'"), "MyApp.Tenant");
    assert_eq!(key("set MyApp.tenant = 'x'"), "myapp.tenant");
    assert_eq!(key("SET Work_Mem TO DEFAULT"), "work_mem");
}

#[test]
fn transaction_scoped_sets_have_no_effect() {
    assert!(effects("SET LOCAL work_mem = '1MB'").is_empty());
    assert!(effects("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").is_empty());
    assert!(effects("SET CONSTRAINTS ALL DEFERRED").is_empty());
    assert!(effects("SET LOCAL TIME ZONE 'UTC'").is_empty());
}

#[test]
fn reset_discard_deallocate() {
    assert_eq!(effects("RESET ALL"), vec![Effect::ResetAll]);
    assert_eq!(
        effects("reset Work_Mem"),
        vec![Effect::Reset {
            key: "work_mem".into()
        }]
    );
    assert_eq!(effects("DISCARD ALL"), vec![Effect::DiscardAll]);
    assert!(effects("DISCARD PLANS").is_empty());
    assert_eq!(
        effects("DEALLOCATE S1"),
        vec![Effect::Deallocate(Some("s1".into()))]
    );
    assert_eq!(
        effects("DEALLOCATE \"S1\""),
        vec![Effect::Deallocate(Some("S1".into()))]
    );
    assert_eq!(
        effects("DEALLOCATE PREPARE ALL"),
        vec![Effect::Deallocate(None)]
    );
}

#[test]
fn pinning_statements() {
    for s in [
        "PREPARE p AS SELECT 1",
        "LISTEN chan",
        "CREATE TEMP TABLE t (a int)",
        "create local temporary table t (a int)",
        "SELECT pg_advisory_lock(1)",
        "select pg_try_advisory_lock(1)",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "SET ROLE other",
        "RESET ROLE",
        "SET SESSION AUTHORIZATION other",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "DISCARD TEMP",
    ] {
        assert!(
            matches!(effects(s).as_slice(), [Effect::Pin(_)]),
            "{s}: {:?}",
            effects(s)
        );
    }
    assert!(effects("SELECT pg_advisory_xact_lock(1)").is_empty());
    assert!(effects("CREATE TABLE t (a int)").is_empty());
}

#[test]
fn several_statements_keep_their_order_and_text() {
    assert_eq!(
        effects("BEGIN; SET a.b = 'x;y'; SELECT $$;SET c.d=1;$$; RESET e.f; COMMIT"),
        vec![
            Effect::Begin,
            set("a.b", "SET a.b = 'x;y'"),
            Effect::Reset { key: "e.f".into() },
            Effect::Commit,
        ]
    );
    assert_eq!(
        effects("SET a.b = 1; ROLLBACK"),
        vec![set("a.b", "SET a.b = 1"), Effect::Rollback]
    );
    // A unit sqlparser cannot parse still reports what its statements do.
    assert_eq!(
        effects("SET a.b = 1; SELEC 2; LISTEN x"),
        vec![
            set("a.b", "SET a.b = 1"),
            Effect::Pin("LISTEN"),
            Effect::Pin("statement Fulcrum cannot parse")
        ]
    );
}

#[test]
fn effects_are_cached_unless_they_carry_text() {
    let c = pg();
    let unit = "BEGIN; SET a.b = 1; COMMIT";
    let first = c.classify_unit(unit);
    let second = c.classify_unit("BEGIN; SET a.b = 2; COMMIT");
    assert_eq!(first.effects.to_vec()[1], set("a.b", "SET a.b = 1"));
    assert_eq!(second.effects.to_vec()[1], set("a.b", "SET a.b = 2"));
    assert_eq!(c.stats().hits, 0, "texts with SETs are parsed each time");
    c.classify_unit("DEALLOCATE s1");
    let hit = c.classify_unit("DEALLOCATE s1");
    assert_eq!(c.stats().hits, 1);
    assert_eq!(
        hit.effects.to_vec(),
        vec![Effect::Deallocate(Some("s1".into()))]
    );
}

#[test]
fn mysql_units_report_no_effects() {
    let c = Classifier::new(Dialect::MySql, &ClassifierConfig::default());
    let unit = c.classify_unit("SET @@session.sql_mode = ''");
    assert_eq!(unit.decision, Decision::Set);
    assert!(unit.effects.is_empty());
}

#[test]
fn statements_opening_with_multibyte_characters_are_read_safely() {
    // sqlparser refuses these, so their first words are read by hand.
    assert_eq!(
        effects("SELECT 1; é"),
        vec![Effect::Pin("statement Fulcrum cannot parse")]
    );
    assert!(effects("ü; SET a.b = 1").contains(&set("a.b", "SET a.b = 1")));
}

#[test]
fn what_cannot_be_proven_to_leave_no_session_state_pins_or_resets() {
    let c = pg();
    let pin = |sql: &str| match c.classify(sql) {
        Decision::Pin(reason) => reason,
        other => panic!("{sql}: {other:?}, not a pin"),
    };
    // DO blocks and other text sqlparser cannot read.
    for sql in [
        "DO $$BEGIN EXECUTE 'DEALLOCATE fulcrum_2'; END$$",
        "DO $$BEGIN PERFORM set_config('app.x', 'y', false); END$$",
        "DO LANGUAGE plpgsql $$BEGIN CREATE TEMP TABLE t (a int); END$$",
    ] {
        assert_eq!(pin(sql), "statement Fulcrum cannot parse", "{sql}");
        assert!(c
            .classify_unit(sql)
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Pin(_))));
    }
    // The temporary schema, whatever keyword made the object.
    for sql in [
        "CREATE TABLE pg_temp.x (a int)",
        "SELECT 1 AS a INTO pg_temp.x",
        "CREATE VIEW pg_temp.v AS SELECT 1",
        "CREATE TABLE pg_temp.accounts (aid int)",
        "CREATE SEQUENCE pg_temp.s",
        "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    ] {
        assert_eq!(pin(sql), "temporary object (pg_temp)", "{sql}");
    }
    // A sequence advanced: no pin, the connection is reset before reuse.
    for sql in [
        "SELECT nextval('s')",
        "SELECT setval('s', 5)",
        "SELECT * FROM nextval('s')",
    ] {
        let unit = c.classify_unit(sql);
        assert_eq!(unit.decision, Decision::Primary, "{sql}");
        assert_eq!(
            unit.effects.to_vec(),
            vec![Effect::ResetBeforeReuse("sequence state (nextval, setval)")],
            "{sql}"
        );
    }
    // Maintenance Fulcrum cannot parse but whose words prove it harmless.
    for sql in [
        "vacuum analyze pgbench_branches",
        "copy pgbench_accounts from stdin with (freeze on)",
        "CHECKPOINT",
    ] {
        assert_eq!(c.classify(sql), Decision::Unknown, "{sql}");
    }
    assert!(matches!(
        c.classify("vacuum analyze t; SELEC 1"),
        Decision::Pin(_)
    ));
    // Calls Fulcrum cannot judge are listed for the cluster to decide.
    assert!(c.classify_unit("CALL p()").unproven.is_some());
    assert!(c.classify_unit("SELECT f(1)").unproven.is_some());
    assert!(c.classify_unit("SELECT lower('A')").unproven.is_none());
}
