//! Clients sharing one server connection in transaction pooling never see
//! each other's session: through a real Fulcrum (`pool_size = 1` unless a
//! test says otherwise, so every client of the user is served by the same
//! server connection) in front of a real primary. Each case is an attack
//! or a leak that was reproduced: a client leaves state behind (a bound
//! `set_config`, a `DO` block, a `pg_temp.` object, a sequence, a user
//! function, a procedure), or replaces another client's prepared statement,
//! and the next client checks it sees nothing of it. Default-deny: what
//! Fulcrum cannot prove harmless pins its client, and the connection is
//! reset before anyone else uses it. Every wait is bounded.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::{Client, SimpleQueryMessage};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// This module's primary (no replicas: isolation is about one connection).
fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder()
            .replicas(0)
            .start()
            .expect("start PostgreSQL");
        c.primary()
            .sql_script(
                APP_DB,
                &format!(
                    "CREATE ROLE iso_role; GRANT iso_role TO {APP_USER};
                     CREATE TABLE iso_accounts (secret text); GRANT ALL ON iso_accounts TO PUBLIC;
                     CREATE SEQUENCE iso_seq; GRANT ALL ON iso_seq TO PUBLIC;
                     CREATE TABLE iso_stolen (v int); GRANT ALL ON iso_stolen TO PUBLIC;
                     CREATE FUNCTION iso_set_tenant(t text) RETURNS text LANGUAGE sql
                       AS $$ SELECT set_config('app.iso_fn', t, false) $$;
                     CREATE PROCEDURE iso_proc() LANGUAGE plpgsql
                       AS $$ BEGIN PERFORM set_config('app.iso_proc', 'A', false); END $$;
                     CREATE TABLE iso_tenant_rows (tenant text, v int);
                     INSERT INTO iso_tenant_rows VALUES ('tenantA', 1), ('tenantA', 2), ('tenantB', 3);
                     ALTER TABLE iso_tenant_rows ENABLE ROW LEVEL SECURITY;
                     CREATE POLICY iso_by_tenant ON iso_tenant_rows
                       USING (tenant = current_setting('app.tenant', true));
                     GRANT SELECT ON iso_tenant_rows TO PUBLIC;
                     CREATE SCHEMA iso_s; GRANT USAGE ON SCHEMA iso_s TO PUBLIC;
                     CREATE FUNCTION iso_s.upper(int) RETURNS text LANGUAGE sql
                       AS $$ SELECT set_config('app.iso_upper', 'A', false) $$;"
                ),
            )
            .expect("set up");
        c
    })
}

fn start(pool_size: u32, extra: &[&str]) -> (FulcrumProcess, PgProxyConfig) {
    let mut cfg = PgProxyConfig::new(&cluster().primary().addr()).pool_size(pool_size);
    for line in extra {
        cfg = cfg.extra(line);
    }
    let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    (p, cfg)
}

/// The first value of `sql`'s first row, or `ERROR <sqlstate>`.
async fn value(client: &Client, sql: &str) -> String {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"));
    match answer {
        Ok(msgs) => msgs
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
                _ => None,
            })
            .unwrap_or_default(),
        Err(e) => format!(
            "ERROR {}",
            e.as_db_error().map_or("(none)", |d| d.code().code())
        ),
    }
}

async fn run(client: &Client, sql: &str) {
    tokio::time::timeout(CALL_TIMEOUT, client.batch_execute(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
}

/// A temporary relation named `name` visible to this session.
fn temp_visible(name: &str) -> String {
    format!(
        "SELECT count(*) FROM pg_class WHERE relname = '{name}' AND relpersistence = 't' \
         AND pg_table_is_visible(oid)"
    )
}

/// What a client does, what the next client asks, and the answer it must
/// get (the one a fresh server connection gives).
struct Case {
    leave: &'static str,
    probe: String,
    clean: &'static str,
}

fn cases() -> Vec<Case> {
    let case = |leave: &'static str, probe: String, clean: &'static str| Case {
        leave,
        probe,
        clean,
    };
    let setting = |name: &str| format!("SELECT coalesce(current_setting('{name}', true), '')");
    vec![
        // Temporary objects made without the TEMP keyword.
        case(
            "CREATE TABLE pg_temp.iso_t (a int)",
            temp_visible("iso_t"),
            "0",
        ),
        case(
            "SELECT 1 AS a INTO pg_temp.iso_into",
            temp_visible("iso_into"),
            "0",
        ),
        case(
            "CREATE VIEW pg_temp.iso_v AS SELECT 1 AS a",
            temp_visible("iso_v"),
            "0",
        ),
        // A temporary table that shadows a real one for the next client.
        case(
            "CREATE TABLE pg_temp.iso_accounts (secret text); \
             INSERT INTO pg_temp.iso_accounts VALUES ('shadow')",
            "SELECT count(*) FROM iso_accounts".into(),
            "0",
        ),
        case(
            "CREATE FUNCTION pg_temp.iso_f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "SELECT count(*) FROM pg_proc WHERE proname = 'iso_f' \
             AND pronamespace = pg_my_temp_schema()"
                .into(),
            "0",
        ),
        // DO blocks: nothing Fulcrum can read.
        case(
            "DO $$BEGIN PERFORM set_config('app.iso_do', 'A', false); END$$",
            setting("app.iso_do"),
            "",
        ),
        case(
            "DO $$BEGIN CREATE TEMP TABLE iso_do_tmp (a int); END$$",
            temp_visible("iso_do_tmp"),
            "0",
        ),
        // A sequence's currval and lastval.
        case(
            "SELECT nextval('iso_seq')",
            "SELECT currval('iso_seq')".into(),
            "ERROR 55000",
        ),
        case(
            "SELECT setval('iso_seq', 42)",
            "SELECT lastval()".into(),
            "ERROR 55000",
        ),
        // A user function and a procedure that set a setting.
        case("SELECT iso_set_tenant('A')", setting("app.iso_fn"), ""),
        case("CALL iso_proc()", setting("app.iso_proc"), ""),
        // set_config whose name is not a literal.
        case(
            "SELECT set_config(n, 'A', false) FROM (VALUES ('app.iso_expr')) v(n)",
            setting("app.iso_expr"),
            "",
        ),
        // The pin reasons Fulcrum always had.
        case(
            "CREATE TEMP TABLE iso_tmp (a int)",
            temp_visible("iso_tmp"),
            "0",
        ),
        case(
            "SELECT pg_advisory_lock(4343)",
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4343".into(),
            "0",
        ),
        case(
            "PREPARE iso_prep AS SELECT 1",
            "SELECT count(*) FROM pg_prepared_statements".into(),
            "0",
        ),
        case(
            "LISTEN iso_channel",
            "SELECT count(*) FROM pg_listening_channels()".into(),
            "0",
        ),
        case(
            "BEGIN; DECLARE iso_c CURSOR WITH HOLD FOR SELECT 1; COMMIT",
            "SELECT count(*) FROM pg_cursors".into(),
            "0",
        ),
        case("SET ROLE iso_role", "SELECT current_user".into(), APP_USER),
        case(
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            "SHOW default_transaction_read_only".into(),
            "off",
        ),
    ]
}

/// Every way a client can leave session state behind, one client after
/// another on the one server connection: the next client sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pin_reason_leaves_nothing_for_the_next_client() {
    let (_p, cfg) = start(1, &[]);
    let mut leaks = Vec::new();
    for c in cases() {
        {
            let a = pg_connect(&cfg).await;
            run(&a, c.leave).await;
        }
        // The next client may be served before Fulcrum has seen the first
        // leave; what it leaves does not go away, so asking until clean
        // within a bound tells a leak from that race.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let b = pg_connect(&cfg).await;
            let got = value(&b, &c.probe).await;
            if got == c.clean {
                break;
            }
            if Instant::now() >= deadline {
                leaks.push(format!("{} -> {} = {got}", c.leave, c.probe));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        leaks.is_empty(),
        "left for the next client:\n{}",
        leaks.join("\n")
    );
}

/// A client reads another client's prepared statement name off the shared
/// connection and replaces it inside a `DO` block: the other client's next
/// execution still runs its own statement, and its parameters go nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_replace_another_clients_prepared_statement() {
    let (_p, cfg) = start(1, &[]);
    let victim = pg_connect(&cfg).await;
    let stmt = victim
        .prepare("SELECT $1::int + 0 AS iso_victim")
        .await
        .unwrap();
    let got: i32 = victim.query_one(&stmt, &[&5i32]).await.unwrap().get(0);
    assert_eq!(got, 5);
    {
        let attacker = pg_connect(&cfg).await;
        let name = value(
            &attacker,
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE '%iso_victim%'",
        )
        .await;
        assert!(
            name.starts_with("fulcrum_"),
            "the shared statement: {name:?}"
        );
        run(
            &attacker,
            &format!(
                "DO $$BEGIN EXECUTE 'DEALLOCATE {name}'; \
                 EXECUTE 'PREPARE {name}(int) AS INSERT INTO iso_stolen VALUES ($1) RETURNING -1'; END$$"
            ),
        )
        .await;
    }
    for v in [7i32, 8, 9] {
        let got: i32 = tokio::time::timeout(CALL_TIMEOUT, victim.query_one(&stmt, &[&v]))
            .await
            .expect("an answer")
            .unwrap()
            .get(0);
        assert_eq!(got, v, "the victim runs its own statement");
    }
    let check = pg_connect(&cfg).await;
    assert_eq!(value(&check, "SELECT count(*) FROM iso_stolen").await, "0");
}

/// `set_config('app.tenant', $1, false)` with a bound value, as drivers
/// send it, is a SET: 20 clients on a pool of 4 each keep their own value
/// (none is pinned: pinned, the fifth would wait for a connection past
/// `pool_timeout`), and 20 later clients see none, nor the rows a
/// row-level-security policy keyed on it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_set_config_follows_its_client_on_a_shared_pool() {
    let (_p, cfg) = start(4, &["pool_timeout = \"3s\""]);
    let tenant = "SELECT coalesce(current_setting('app.tenant', true), '')";
    let mut clients = Vec::new();
    for i in 0..20 {
        let c = pg_connect(&cfg).await;
        let set: String = c
            .query_one(
                "select set_config('app.tenant', $1, false)",
                &[&format!("tenant{i}")],
            )
            .await
            .unwrap_or_else(|e| panic!("client {i}: {e}"))
            .get(0);
        assert_eq!(set, format!("tenant{i}"));
        clients.push(c);
    }
    for round in 0..3 {
        for (i, c) in clients.iter().enumerate() {
            assert_eq!(
                value(c, tenant).await,
                format!("tenant{i}"),
                "round {round}"
            );
        }
    }
    // A NULL value resets it.
    let first = &clients[0];
    first
        .query_one(
            "select set_config('app.tenant', $1, false)",
            &[&None::<String>],
        )
        .await
        .ok();
    assert_eq!(value(first, tenant).await, "");
    drop(clients);
    // A tenant the policy shows rows to, set by a client that then leaves.
    {
        let a = pg_connect(&cfg).await;
        a.query_one("select set_config('app.tenant', $1, false)", &[&"tenantA"])
            .await
            .unwrap();
        assert_eq!(value(&a, "SELECT count(*) FROM iso_tenant_rows").await, "2");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..20 {
        let next = pg_connect(&cfg).await;
        assert_eq!(value(&next, tenant).await, "", "later client {i}");
        assert_eq!(
            value(&next, "SELECT count(*) FROM iso_tenant_rows").await,
            "0",
            "later client {i} read another tenant's rows"
        );
    }
}

/// The same with psycopg, the driver the leak was found with: its bound
/// `%s` goes to the server as `$1` of an unnamed statement.
#[test]
fn psycopg_bound_set_config_reaches_no_later_client() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_p, cfg) = start(4, &["pool_timeout = \"3s\""]);
    let (host, port) = cfg.listen.rsplit_once(':').expect("host:port");
    let dsn = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10"
    );
    let script = r#"
import os, psycopg
DSN = os.environ['DSN']
conns = [psycopg.connect(DSN, autocommit=True) for _ in range(20)]
want = ["tenantA" if i == 0 else f"tenant{i}" for i in range(20)]
for c, w in zip(conns, want):
    c.execute("select set_config('app.tenant', %s, false)", (w,))
ok = 0
for _ in range(3):
    for c, w in zip(conns, want):
        got = c.execute("select current_setting('app.tenant', true)").fetchone()[0]
        ok += got == w
print(ok)
rows = conns[0].execute("select count(*) from iso_tenant_rows").fetchone()[0]
print(rows)
for c in conns:
    c.close()
"#;
    let out = fulcrum_suite::run_python("psycopg", script, &[("DSN", &dsn)], CALL_TIMEOUT * 6);
    // The first client is tenantA: the policy shows it its two rows.
    assert_eq!(out, "60\n2\n", "each client keeps its own value");
    rt.block_on(async {
        for i in 0..20 {
            let next = pg_connect(&cfg).await;
            let tenant = "SELECT coalesce(current_setting('app.tenant', true), '')";
            assert_eq!(value(&next, tenant).await, "", "later client {i}");
            assert_eq!(
                value(&next, "SELECT count(*) FROM iso_tenant_rows").await,
                "0",
                "later client {i}"
            );
        }
    });
}

/// Default-deny must not cost ordinary calls a pin: psycopg's everyday
/// calls (bound parameters, executemany, transactions, type lookup, a
/// server-side cursor, COPY, a bound set_config) pin no client.
#[test]
fn psycopg_everyday_calls_pin_no_client() {
    let mut cfg = PgProxyConfig::new(&cluster().primary().addr()).pool_size(2);
    cfg.log = "info,fulcrum_pin=debug";
    // The login waits for the function catalog: on a loaded machine its
    // first read can take longer than the default 100 ms, and a call read
    // before it pins (default-deny, right, but not what is looked at here).
    cfg.extra.push("function_catalog_wait = \"10s\"".into());
    let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    let (host, port) = cfg.listen.rsplit_once(':').expect("host:port");
    let dsn = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10"
    );
    let script = r#"
import os, psycopg
from psycopg.types import TypeInfo
DSN = os.environ['DSN']
with psycopg.connect(DSN) as conn:
    conn.execute("select %s::int + %s", (1, 2)).fetchone()
    conn.execute("select version(), current_setting('server_version_num')").fetchone()
    with conn.transaction():
        cur = conn.cursor()
        cur.executemany("select %s::text", [("a",), ("b",)])
        conn.execute("select count(*) from iso_accounts where secret = %s", ("x",)).fetchone()
    TypeInfo.fetch(conn, "text")
    with conn.cursor(name="iso_named") as named:
        named.execute("select generate_series(1, 10)")
        named.fetchall()
    with conn.cursor().copy("copy (select 1) to stdout") as copy:
        for _ in copy:
            pass
    conn.execute("select set_config('app.tenant', %s, false)", ("t1",))
    conn.commit()
print("ok")
"#;
    let out = fulcrum_suite::run_python("psycopg", script, &[("DSN", &dsn)], CALL_TIMEOUT * 6);
    assert_eq!(out, "ok\n");
    let pins: Vec<String> = p
        .log_contents()
        .lines()
        .filter(|l| l.contains("client pinned"))
        .map(str::to_owned)
        .collect();
    assert!(pins.is_empty(), "psycopg pinned:\n{}", pins.join("\n"));
    // The log does show a pin when there is one.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = pg_connect(&cfg).await;
        run(&c, "DO $$BEGIN END$$").await;
        assert_eq!(value(&c, "SELECT 1").await, "1");
    });
    if let Err(e) = p.wait_for_log("client pinned", Duration::from_secs(5)) {
        panic!("a DO block's pin was not logged: {e}\n{}", p.log_contents());
    }
}

mod encoding;
mod probes;
