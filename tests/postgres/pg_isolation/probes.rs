//! Session state a client left for the next one (or lost), found by
//! probing a real Fulcrum with one server connection: client A runs a
//! statement and stays connected, client B asks while A is idle, A asks
//! again. Each was a reproduced leak:
//! - `SELECT * FROM set_config(...)` (a call in the FROM list) was not
//!   seen as a SET: B read A's value.
//! - `SELECT iso_s.upper(1)`, a user's function with a built-in's name,
//!   was taken for the built-in: not pinned, B read what it set.
//! - `CREATE FUNCTION f() ...; SELECT f()` in one query: the function
//!   catalog, read before, did not know `f`, so the call was not pinned.
//! - `set_config('search_path', 'iso_s, public', false)` was replayed as
//!   `SET search_path = 'iso_s, public'` (one schema of that name): A lost
//!   its own path.
//! - `SET search_path TO 'pg_temp', 'public'` (a string, not the
//!   identifier Fulcrum looks for), then a plain `CREATE TABLE`: a
//!   temporary table, and B saw it.

use super::{cluster, start, temp_visible, CALL_TIMEOUT};
use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};

/// A runs LEAVE and stays; B (while A is idle) and then A run PROBE. Prints
/// `B <value or SQLSTATE>` and `A <value>`.
const SCRIPT: &str = r#"
import os, psycopg
DSN, LEAVE, PROBE = os.environ['DSN'], os.environ['LEAVE'], os.environ['PROBE']
a = psycopg.connect(DSN, autocommit=True)
a.execute(LEAVE)
try:
    with psycopg.connect(DSN, autocommit=True) as b:
        print("B", b.execute(PROBE).fetchone()[0])
except psycopg.Error as e:
    print("B", e.sqlstate)
print("A", a.execute(PROBE).fetchone()[0])
a.close()
"#;

fn leave_and_probe(leave: &str, probe: &str) -> String {
    let _ = cluster();
    // One server connection, a short wait for it (a pinned A makes B's
    // login time out: 53300), and the function catalog read before the
    // first statement (else any user function call pins for that alone).
    let (_p, cfg) = start(
        1,
        &["pool_timeout = \"2s\"", "function_catalog_wait = \"10s\""],
    );
    let (host, port) = cfg.listen.rsplit_once(':').expect("host:port");
    let dsn = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10"
    );
    fulcrum_suite::run_python(
        "psycopg",
        SCRIPT,
        &[("DSN", &dsn), ("LEAVE", leave), ("PROBE", probe)],
        CALL_TIMEOUT * 3,
    )
}

const SETTING: &str = "SELECT coalesce(current_setting('app.iso_probe', true), '')";

#[test]
fn set_config_in_the_from_list_is_replayed_not_left() {
    let out = leave_and_probe(
        "SELECT * FROM set_config('app.iso_probe', 'A', false)",
        SETTING,
    );
    assert_eq!(out, "B \nA A\n", "B sees nothing, A keeps its value");
}

#[test]
fn a_users_namesake_of_a_built_in_pins_its_client() {
    let out = leave_and_probe(
        "SELECT iso_s.upper(1)",
        "SELECT coalesce(current_setting('app.iso_upper', true), '')",
    );
    assert_eq!(out, "B 53300\nA A\n", "A pinned, B waited");
}

#[test]
fn a_function_defined_and_called_in_one_query_pins_its_client() {
    let out = leave_and_probe(
        "CREATE FUNCTION iso_defined() RETURNS text LANGUAGE sql \
         AS $$ SELECT set_config('app.iso_probe', 'A', false) $$; SELECT iso_defined()",
        SETTING,
    );
    assert_eq!(out, "B 53300\nA A\n", "A pinned, B waited");
}

#[test]
fn a_search_path_set_by_set_config_is_replayed_as_a_list() {
    let out = leave_and_probe(
        "SELECT set_config('search_path', 'iso_s, public', false)",
        "SHOW search_path",
    );
    assert_eq!(out, "B \"$user\", public\nA iso_s, public\n");
}

#[test]
fn a_search_path_naming_pg_temp_pins_its_client() {
    let out = leave_and_probe(
        "SET search_path TO 'pg_temp', 'public'; CREATE TABLE iso_sneaky (a int)",
        &temp_visible("iso_sneaky"),
    );
    assert_eq!(out, "B 53300\nA 1\n", "A pinned, B waited");
}

/// The same with a transaction-local path spelled with an escape: the
/// table outlives the transaction.
#[test]
fn a_local_escaped_search_path_naming_pg_temp_pins_its_client() {
    let out = leave_and_probe(
        "BEGIN; SET LOCAL search_path TO E'pg\\x5ftemp'; \
         CREATE TABLE iso_sneaky_local (a int); COMMIT",
        &temp_visible("iso_sneaky_local"),
    );
    assert_eq!(out, "B 53300\nA 1\n", "A pinned, B waited");
}
