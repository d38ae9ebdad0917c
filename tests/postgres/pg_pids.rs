//! The pid a client in transaction pooling was given (BackendKeyData) is the
//! one it sees everywhere, through a real Fulcrum: `SELECT pg_backend_pid()`
//! (simple and extended protocol), `pg_terminate_backend` and
//! `pg_cancel_backend` of it from another client (Fulcrum ends or cancels
//! that client and answers `t`, as the server would), and the pid of the
//! notifications a client sends, its own included. psycopg's own suite
//! failed 6 tests of this kind in transaction pooling.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::{Client, SimpleQueryMessage};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        PgCluster::builder()
            .replicas(0)
            .start()
            .expect("start PostgreSQL")
    })
}

fn start() -> (FulcrumProcess, PgProxyConfig) {
    let cfg = PgProxyConfig::new(&cluster().primary().addr()).pool_size(2);
    let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    (p, cfg)
}

async fn value(client: &Client, sql: &str) -> Result<String, tokio_postgres::Error> {
    let msgs = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))?;
    Ok(msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_default())
}

/// `pg_terminate_backend` of another client's pid ends that client with
/// 57P01 and answers `t`; the server's pids are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_a_clients_pid_ends_that_client() {
    let (_p, cfg) = start();
    let victim = pg_connect(&cfg).await;
    let killer = pg_connect(&cfg).await;
    let pid = value(&victim, "SELECT pg_backend_pid()").await.unwrap();
    assert_eq!(
        value(&victim, "select pg_backend_pid();").await.unwrap(),
        pid,
        "the same pid each time, whatever server runs the client's units"
    );
    let server_pid = value(&victim, "SELECT pg_backend_pid() + 0").await.unwrap();
    assert_ne!(server_pid, pid, "a pooled server's pid is not the client's");
    assert_eq!(
        value(&killer, &format!("SELECT pg_terminate_backend({pid})"))
            .await
            .unwrap(),
        "t"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        match value(&victim, "SELECT 1").await {
            Err(e) => break e,
            Ok(_) => {
                assert!(Instant::now() < deadline, "the client was not ended");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    if let Some(db) = err.as_db_error() {
        assert_eq!(db.code().code(), "57P01", "{db:?}");
    } else {
        assert!(victim.is_closed(), "{err}");
    }
    // The killer goes on; a pid Fulcrum did not give out is the server's.
    assert_eq!(
        value(&killer, "SELECT pg_terminate_backend(1)")
            .await
            .unwrap(),
        "f"
    );
}

/// `pg_cancel_backend` of another client's pid cancels its running
/// statement (57014) and answers `t`; the client goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_clients_pid_cancels_its_statement() {
    let (_p, cfg) = start();
    let sleeper = pg_connect(&cfg).await;
    let other = pg_connect(&cfg).await;
    let pid = value(&sleeper, "SELECT pg_backend_pid()").await.unwrap();
    let started = Instant::now();
    let sleeping = tokio::spawn(async move {
        let r = value(&sleeper, "SELECT pg_sleep(20)").await;
        (
            r.map_err(|e| e.code().map(|c| c.code().to_owned())),
            sleeper,
        )
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        value(&other, &format!("SELECT pg_cancel_backend({pid})"))
            .await
            .unwrap(),
        "t"
    );
    let (r, sleeper) = sleeping.await.unwrap();
    assert_eq!(r, Err(Some("57014".to_owned())));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(value(&sleeper, "SELECT 2").await.unwrap(), "2");
}

/// psycopg: `conn.info.backend_pid` (BackendKeyData), `pg_backend_pid()`
/// through the extended protocol, and the pid of notifications, the
/// client's own and another client's, all agree.
#[test]
fn psycopg_sees_one_pid_for_itself_and_its_notifications() {
    let (_p, cfg) = start();
    let (host, port) = cfg.listen.rsplit_once(':').expect("host:port");
    let dsn = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10"
    );
    let script = r#"
import os, threading, time, psycopg
DSN = os.environ['DSN']
with psycopg.connect(DSN, autocommit=True) as conn, psycopg.connect(DSN, autocommit=True) as other:
    print("same pid", conn.execute("select pg_backend_pid()").fetchone()[0] == conn.info.backend_pid)
    conn.execute("listen pid_ch")
    conn.execute("notify pid_ch, 'mine'")
    other.execute("select pg_notify('pid_ch', 'theirs')")
    got = {n.payload: n.pid for n in conn.notifies(timeout=5, stop_after=2)}
    print("own", got.get('mine') == conn.info.backend_pid)
    print("other", got.get('theirs') == other.info.backend_pid)
    # The pid bound as a parameter, as psycopg's own suite does.
    t = threading.Timer(0.5, lambda: print("cancel", other.execute("select pg_cancel_backend(%s)", (conn.info.backend_pid,)).fetchone()[0]))
    t.start()
    try:
        conn.execute("select pg_sleep(20)")
        print("not cancelled")
    except psycopg.errors.QueryCanceled:
        t.join()
        print("cancelled")
    print("terminate", other.execute("select pg_terminate_backend(%s)", (conn.info.backend_pid,)).fetchone()[0])
    try:
        for _ in range(50):
            conn.execute("select 1")
            time.sleep(0.1)
        print("still alive")
    except psycopg.OperationalError as e:
        print("ended", getattr(e, "sqlstate", None) or "closed")
    print("not ours", other.execute("select pg_terminate_backend(%s)", (1,)).fetchone()[0])
"#;
    let out = fulcrum_suite::run_python("psycopg", script, &[("DSN", &dsn)], CALL_TIMEOUT * 6);
    assert!(
        out == "same pid True\nown True\nother True\ncancel True\ncancelled\nterminate True\nended 57P01\nnot ours False\n"
            || out == "same pid True\nown True\nother True\ncancel True\ncancelled\nterminate True\nended closed\nnot ours False\n",
        "{out}"
    );
}
