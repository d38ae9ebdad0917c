//! The life of a PostgreSQL client between units of work, through a real
//! Fulcrum in front of a real primary with two streaming replicas (one
//! cluster for this binary): local answers that need no server, state a
//! pooled server connection must not carry to the next client, transaction
//! modes that decide the server, and what a client is told when its server
//! dies under a COMMIT. Every wait is bounded: a hang fails the test.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_suite::{
    metric_sum, pg_connect, pg_connect_as, pg_connect_with_options, rss_kb, start_with_metrics,
    with_metrics, PgProxyConfig,
};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// Longest any single client call may take before the test calls it a hang.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A role the app user may take at login (`options=-c role=...`).
const STARTUP_ROLE: &str = "fulcrum_startup_role";

/// This module's own cluster, not shared: `terminate_running` ends any
/// backend on the primary running a given statement, another module's too.
fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder()
            .replicas(2)
            .start()
            .expect("start PostgreSQL cluster");
        c.primary()
            .sql_script(
                APP_DB,
                &format!(
                    "CREATE ROLE {STARTUP_ROLE};
                     GRANT {STARTUP_ROLE} TO {APP_USER};
                     CREATE TABLE ses_rows (id int);
                     GRANT ALL ON ses_rows TO PUBLIC;
                     -- A COMMIT that takes long: a deferred trigger sleeps at commit.
                     CREATE TABLE slow_commit (id int);
                     GRANT ALL ON slow_commit TO PUBLIC;
                     CREATE FUNCTION slow_commit_fn() RETURNS trigger LANGUAGE plpgsql AS
                       $$ BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
                     CREATE CONSTRAINT TRIGGER slow_commit_trg AFTER INSERT ON slow_commit
                       DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_fn();"
                ),
            )
            .expect("set up");
        c.wait_replicas_caught_up(Duration::from_secs(30))
            .expect("replicas caught up");
        c
    })
}

fn with_replicas(pool_size: u32) -> PgProxyConfig {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).pool_size(pool_size);
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg
}

fn start(cfg: PgProxyConfig) -> (FulcrumProcess, PgProxyConfig) {
    (
        FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum"),
        cfg,
    )
}

/// The first column of the first row of `sql`, within `CALL_TIMEOUT`.
async fn one(client: &Client, sql: &str) -> String {
    let msgs = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .expect("one row")
}

async fn exec(client: &Client, sql: &str) -> Result<(), tokio_postgres::Error> {
    tokio::time::timeout(CALL_TIMEOUT, client.batch_execute(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
}

/// The name tokio-postgres gave `stmt` on the wire (`s<N>`). Its accessor is
/// crate-private; its `Debug` shows the name.
fn statement_name(stmt: &tokio_postgres::Statement) -> String {
    let debug = format!("{stmt:?}");
    let rest = debug
        .split_once("name: \"")
        .unwrap_or_else(|| panic!("no name in {debug}"))
        .1;
    rest[..rest.find('"').expect("closing quote")].to_owned()
}

#[tokio::test]
async fn deallocate_of_a_mapped_statement_is_answered_without_a_server() {
    let (_p, cfg) = start(with_replicas(1));
    let client = pg_connect(&cfg).await;
    for round in 0..3 {
        let stmt = client.prepare("SELECT 41 + 1").await.unwrap();
        assert_eq!(
            client.query_one(&stmt, &[]).await.unwrap().get::<_, i32>(0),
            42
        );
        // tokio-postgres names its statements s0, s1, ... from one counter
        // for the whole process (other modules of this binary prepare too),
        // so the name is read from the statement; the client is between
        // transactions, so no server connection is attached.
        let name = statement_name(&stmt);
        exec(&client, &format!("DEALLOCATE {name}"))
            .await
            .unwrap_or_else(|e| panic!("DEALLOCATE {name} (round {round}): {e}"));
        assert_eq!(one(&client, "SELECT 'after'").await, "after");
    }
    // Inside a transaction (attached), and DEALLOCATE ALL, alike.
    let stmt = client.prepare("SELECT 7").await.unwrap();
    exec(&client, "BEGIN").await.unwrap();
    assert_eq!(
        client.query_one(&stmt, &[]).await.unwrap().get::<_, i32>(0),
        7
    );
    exec(&client, &format!("DEALLOCATE {}", statement_name(&stmt)))
        .await
        .unwrap();
    exec(&client, "COMMIT").await.unwrap();
    exec(&client, "DEALLOCATE ALL").await.unwrap();
    // A name the client never prepared is the server's business: its error.
    let err = exec(&client, "DEALLOCATE nope").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("26000"));
    assert_eq!(one(&client, "SELECT 'still here'").await, "still here");
}

#[tokio::test]
async fn a_startup_role_does_not_leak_to_the_next_client() {
    // One server connection: every client below is served by the same
    // server session, one after the other.
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()).pool_size(1));
    let plain = pg_connect(&cfg).await;
    assert_eq!(one(&plain, "SELECT current_user").await, APP_USER);
    let with_role = pg_connect_with_options(&cfg, &format!("-c role={STARTUP_ROLE}")).await;
    assert_eq!(one(&with_role, "SELECT current_user").await, STARTUP_ROLE);
    drop(with_role);
    for _ in 0..3 {
        assert_eq!(one(&plain, "SELECT current_user").await, APP_USER);
        let later = pg_connect(&cfg).await;
        assert_eq!(one(&later, "SELECT current_user").await, APP_USER);
    }
}

#[tokio::test]
async fn set_transaction_read_write_sends_the_transaction_to_the_primary() {
    let (_p, cfg) = start(with_replicas(4));
    let client = pg_connect(&cfg).await;
    // Each statement on its own: Fulcrum answers BEGIN and SET TRANSACTION
    // itself and lets the transaction's first statement pick the server.
    exec(&client, "BEGIN READ ONLY").await.unwrap();
    exec(&client, "SET TRANSACTION READ WRITE").await.unwrap();
    exec(&client, "INSERT INTO ses_rows VALUES (1)")
        .await
        .expect("READ WRITE undid READ ONLY: the insert runs on the primary");
    assert_eq!(one(&client, "SELECT pg_is_in_recovery()").await, "f");
    exec(&client, "COMMIT").await.unwrap();
    // A read-only transaction still goes to a replica (from a client that
    // has not written: this one's reads wait for its insert to replicate).
    let reader = pg_connect(&cfg).await;
    exec(&reader, "BEGIN READ ONLY").await.unwrap();
    assert_eq!(one(&reader, "SELECT pg_is_in_recovery()").await, "t");
    exec(&reader, "COMMIT").await.unwrap();
    // And a write in a read-only transaction fails as it does directly.
    exec(&client, "BEGIN READ ONLY").await.unwrap();
    let err = exec(&client, "INSERT INTO ses_rows VALUES (2)")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("25006"));
    exec(&client, "ROLLBACK").await.unwrap();
}

/// Terminates, on the primary, the backend running a statement that starts
/// with `prefix`, once it is seen running (within `CALL_TIMEOUT`).
async fn terminate_running(prefix: &str) {
    let started = Instant::now();
    let sql = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE state = 'active' AND query LIKE '{prefix}%' AND pid <> pg_backend_pid()"
    );
    loop {
        let out = cluster().primary().sql(&sql).expect("terminate");
        if out.contains('t') {
            return;
        }
        assert!(
            started.elapsed() < CALL_TIMEOUT,
            "no running statement like {prefix}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_commit_in_flight_when_its_server_dies_may_have_committed() {
    let (_p, cfg) = start(with_replicas(4));
    let client = pg_connect(&cfg).await;
    exec(&client, "BEGIN").await.unwrap();
    exec(&client, "INSERT INTO slow_commit VALUES (1)")
        .await
        .unwrap();
    let commit = tokio::spawn(async move {
        let r = exec(&client, "COMMIT").await;
        (client, r)
    });
    terminate_running("COMMIT").await;
    let (client, r) = commit.await.unwrap();
    let err = r.expect_err("the COMMIT's server died");
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("08007"),
        "transaction_resolution_unknown: {err}"
    );
    // The client is told it is in a failed transaction until it ends it,
    // then goes on on a new server connection.
    exec(&client, "ROLLBACK").await.unwrap();
    assert_eq!(one(&client, "SELECT 'next'").await, "next");

    // An autocommit write in flight: the same.
    let writer = pg_connect(&cfg).await;
    let write = tokio::spawn(async move {
        let r = exec(&writer, "INSERT INTO slow_commit VALUES (2)").await;
        (writer, r)
    });
    terminate_running("INSERT INTO slow_commit").await;
    let (writer, r) = write.await.unwrap();
    assert_eq!(
        r.expect_err("the write's server died")
            .code()
            .map(|c| c.code()),
        Some("08007")
    );
    assert_eq!(one(&writer, "SELECT 'next'").await, "next");

    // A transaction that dies before its COMMIT was sent was not committed.
    let txn = pg_connect(&cfg).await;
    exec(&txn, "BEGIN").await.unwrap();
    let pid = one(&txn, "SELECT pg_backend_pid() + 0").await;
    let sleeper = tokio::spawn(async move {
        let r = exec(&txn, "SELECT pg_sleep(60)").await;
        (txn, r)
    });
    terminate_running("SELECT pg_sleep(60)").await;
    let (txn, r) = sleeper.await.unwrap();
    assert_eq!(
        r.expect_err("the server died").code().map(|c| c.code()),
        Some("08006"),
        "pid {pid}"
    );
    exec(&txn, "ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_server_message_over_max_message_size_closes_that_connection() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(2)
        .extra("max_message_size = \"1MB\"");
    let (_p, cfg) = start(cfg);
    let client = pg_connect(&cfg).await;
    // A 2 MB error (its message quotes the input) is buffered whole by no
    // one: the connection is closed. (A DO block would pin the client, whose
    // session ends with its connection.)
    let err = exec(
        &client,
        "UPDATE ses_rows SET id = repeat('x', 2000000)::int",
    )
    .await
    .expect_err("the error is over the limit");
    // A write on the primary may have written before the error: 08007.
    assert_eq!(err.code().map(|c| c.code()), Some("08007"), "{err}");
    let text = err
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    assert!(text.contains("max_message_size"), "{text}");
    // The client goes on, and rows over the limit still stream through.
    assert_eq!(one(&client, "SELECT 'after'").await, "after");
    assert_eq!(
        one(&client, "SELECT length(repeat('y', 3000000))").await,
        "3000000"
    );
    let big = one(&client, "SELECT repeat('z', 3000000)").await;
    assert_eq!(big.len(), 3_000_000);
}

/// A simple Query message.
fn query_message(sql: &str) -> Vec<u8> {
    let mut m = vec![b'Q'];
    m.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    m.extend_from_slice(sql.as_bytes());
    m.push(0);
    m
}

/// Reads server messages from `s` until `n` ReadyForQuery have arrived;
/// returns the first DataRow's first column, if any.
fn read_until_ready(s: &mut std::net::TcpStream, n: usize) -> Option<String> {
    use std::io::Read;
    let (mut seen, mut first_value) = (0, None);
    let mut header = [0u8; 5];
    while seen < n {
        s.read_exact(&mut header).expect("server message");
        let len = i32::from_be_bytes(header[1..5].try_into().unwrap()) as usize - 4;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).expect("server message body");
        match header[0] {
            b'Z' => seen += 1,
            b'D' if first_value.is_none() => {
                let vlen = i32::from_be_bytes(body[2..6].try_into().unwrap()) as usize;
                first_value = Some(String::from_utf8_lossy(&body[6..6 + vlen]).into_owned());
            }
            b'E' => panic!("error: {}", String::from_utf8_lossy(&body)),
            _ => {}
        }
    }
    first_value
}

#[tokio::test]
async fn a_held_client_is_not_read_without_bound() {
    use std::io::Write;
    // While a write waits behind the client's read on a replica, Fulcrum
    // reads no more than max_message_size plus one read of what the client
    // pipelines after it: the client's own socket pushes back.
    let cfg = with_replicas(4)
        .client_auth("trust")
        .extra("max_message_size = \"64kB\"");
    let (p, cfg) = start(cfg);
    let mut s = std::net::TcpStream::connect(&cfg.listen).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&fulcrum_suite::startup_message(
        fulcrum_suite::PROTOCOL_3_0,
        &[("user", APP_USER), ("database", APP_DB)],
    ))
    .unwrap();
    read_until_ready(&mut s, 1);
    const FILLERS: usize = 40_000;
    let filler = query_message(&format!("SELECT '{}'", "f".repeat(1000)));
    let mut writer = s.try_clone().unwrap();
    let before = rss_kb(p.pid());
    let sender = std::thread::spawn(move || {
        writer
            .write_all(&query_message(
                "SELECT pg_is_in_recovery()::text || pg_sleep(2)::text",
            ))
            .unwrap();
        writer
            .write_all(&query_message("INSERT INTO ses_rows VALUES (3)"))
            .unwrap();
        // 40 MB pipelined behind them; this blocks while Fulcrum does not read.
        let batch = filler.repeat(100);
        for _ in 0..FILLERS / 100 {
            writer.write_all(&batch).unwrap();
        }
    });
    let mut peak = 0;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss_kb(p.pid()));
    }
    let on_replica = read_until_ready(&mut s, 1);
    assert_eq!(
        on_replica.as_deref(),
        Some("true"),
        "the read ran on a replica"
    );
    read_until_ready(&mut s, 1 + FILLERS);
    sender.join().expect("every query sent");
    // Held, Fulcrum buffers at most 64 kB plus a read of the 40 MB.
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 16 * 1024,
        "Fulcrum grew by {grew} kB while the client was held"
    );
}

/// A raw client logged in (trust) and ready.
pub(crate) fn raw_client(cfg: &PgProxyConfig) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(&cfg.listen).expect("connect");
    s.set_read_timeout(Some(CALL_TIMEOUT)).unwrap();
    s.write_all(&fulcrum_suite::startup_message(
        fulcrum_suite::PROTOCOL_3_0,
        &[("user", APP_USER), ("database", APP_DB)],
    ))
    .unwrap();
    read_until_ready(&mut s, 1);
    s
}

/// A Parse message for statement `name`, no parameter types.
fn parse_message(name: &str, sql: &str) -> Vec<u8> {
    let body = [name.as_bytes(), b"\0", sql.as_bytes(), b"\0\0\0"].concat();
    let mut m = vec![b'P'];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(&body);
    m
}

const SYNC: &[u8] = b"S\0\0\0\x04";
const FLUSH: &[u8] = b"H\0\0\0\x04";

#[tokio::test]
async fn an_answer_fulcrum_owes_is_sent_even_when_the_server_owes_nothing() {
    use std::io::{Read, Write};
    // One server connection, so the second client meets the statement the
    // first one prepared on it.
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(1)
        .client_auth("trust");
    let (_p, cfg) = start(cfg);
    let mut a = raw_client(&cfg);
    a.write_all(&[parse_message("a1", "SELECT 4242"), SYNC.to_vec()].concat())
        .unwrap();
    read_until_ready(&mut a, 1);
    let mut b = raw_client(&cfg);
    b.write_all(&query_message("BEGIN; SELECT 1")).unwrap();
    read_until_ready(&mut b, 1);
    // In its transaction, b prepares the same statement and flushes: the
    // server has it already, so Fulcrum answers ParseComplete itself; the
    // server, sent only the Flush, answers nothing.
    b.write_all(&[parse_message("b1", "SELECT 4242"), FLUSH.to_vec()].concat())
        .unwrap();
    let mut reply = [0u8; 5];
    b.read_exact(&mut reply)
        .expect("ParseComplete within the timeout, not a wait without end");
    assert_eq!(reply, *b"1\0\0\0\x04");
    b.write_all(&[query_message("COMMIT")].concat()).unwrap();
    read_until_ready(&mut b, 1);
}

/// `fulcrum_prepared_statements` from one scrape of `/metrics` on `port`
/// (0 before the first refresh shows it).
fn prepared_statements_gauge(port: u16) -> u64 {
    metric_sum(port, "fulcrum_prepared_statements", "")
}

/// 100,000 distinct named statements prepared by clients that then leave
/// do not stay in Fulcrum: the cluster-wide statement registry (one shared
/// entry per definition) comes back to its size before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_of_clients_that_left_are_dropped_from_the_registry() {
    const CLIENTS: usize = 4;
    const EACH: usize = 25_000;
    let metrics_port = fulcrum_testkit::free_port();
    // Generous timeouts: 100k prepares load the shared primary while the
    // binary's other tests run.
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(4)
        .extra("connect_timeout = \"15s\"")
        .extra("pool_timeout = \"30s\"");
    let _p =
        FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics_port)).expect("start fulcrum");
    let before = prepared_statements_gauge(metrics_port);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(pg_connect(&cfg).await);
    }
    let prepared = futures_util::future::try_join_all(clients.iter().enumerate().map(
        |(c, client)| async move {
            let texts: Vec<String> = (0..EACH)
                .map(|i| format!("SELECT {} + 0", c * EACH + i))
                .collect();
            futures_util::future::try_join_all(texts.iter().map(|t| client.prepare(t))).await
        },
    ));
    let statements = tokio::time::timeout(Duration::from_secs(180), prepared)
        .await
        .expect("100k prepares took over 180 s")
        .expect("prepare");
    let held = prepared_statements_gauge(metrics_port);
    assert!(
        held >= before + (CLIENTS * EACH) as u64,
        "{held} held, {before} before"
    );
    // The clients leave without closing their statements.
    drop(clients);
    drop(statements);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = prepared_statements_gauge(metrics_port);
        if now == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now} statements still registered after the clients left ({before} before)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `max_prepared_statements` bounds the shared statements on a server
/// connection the way PgBouncer does: the least recently used are closed
/// on the server and prepared again when used, so a client with more named
/// statements than the bound keeps working on the same server connection
/// (before, the connection was closed each time it went over the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_over_the_bound_are_evicted_and_prepared_again() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(1)
        .extra("max_prepared_statements = 10");
    let (_p, cfg) = start(cfg);
    let client = pg_connect(&cfg).await;
    let first_pid: i32 = client
        .query_one("SELECT pg_backend_pid() + 0", &[])
        .await
        .unwrap()
        .get(0);
    let mut statements = Vec::new();
    for i in 0..30 {
        statements.push(
            client
                .prepare(&format!("SELECT {i}::int + $1::int"))
                .await
                .expect("prepare"),
        );
    }
    for round in 0..2 {
        for (i, s) in statements.iter().enumerate() {
            let row = tokio::time::timeout(CALL_TIMEOUT, client.query_one(s, &[&1i32]))
                .await
                .expect("execute hung")
                .unwrap_or_else(|e| panic!("round {round}, statement {i}: {e:?}"));
            assert_eq!(row.get::<_, i32>(0), i as i32 + 1);
        }
    }
    let held: i64 = client
        .query_one("SELECT count(*) FROM pg_prepared_statements", &[])
        .await
        .unwrap()
        .get(0);
    assert!(held <= 11, "{held} statements on the server connection");
    let last_pid: i32 = client
        .query_one("SELECT pg_backend_pid() + 0", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(first_pid, last_pid, "the same server connection all along");
}

/// A client quiet for longer than `client_idle_timeout` outside a
/// transaction is closed, told why (57P05, naming the key).
#[tokio::test]
async fn an_idle_client_is_closed_at_client_idle_timeout() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr()).extra("client_idle_timeout = \"1s\"");
    let (_p, cfg) = start(cfg);
    let port: u16 = cfg.listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let mut c = tokio_postgres::Config::new();
    c.host("127.0.0.1")
        .port(port)
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname(APP_DB);
    let (client, conn) = c.connect(NoTls).await.expect("connect");
    let closed = tokio::spawn(conn);
    assert_eq!(one(&client, "SELECT 1").await, "1");
    let started = Instant::now();
    let ended = tokio::time::timeout(CALL_TIMEOUT, closed)
        .await
        .expect("closed within the timeout")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    let e = ended.expect_err("closed with an error");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "57P05");
    assert!(
        db.message().contains("client_idle_timeout"),
        "{}",
        db.message()
    );
}

/// A client quiet inside a transaction for longer than
/// `idle_transaction_timeout` is told (25P03), its transaction rolled back,
/// and its server connection returned: with a pool of one, the next client
/// gets it at once and the row is not there.
#[tokio::test]
async fn idle_in_transaction_is_rolled_back_and_the_server_returned() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(1)
        .extra("idle_transaction_timeout = \"1s\"")
        .extra("pool_timeout = \"3s\"");
    let (_p, cfg) = start(cfg);
    let port: u16 = cfg.listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let mut c = tokio_postgres::Config::new();
    c.host("127.0.0.1")
        .port(port)
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname(APP_DB);
    let (client, conn) = c.connect(NoTls).await.expect("connect");
    let closed = tokio::spawn(conn);
    exec(&client, "BEGIN; INSERT INTO ses_rows VALUES (-25003)")
        .await
        .unwrap();
    let ended = tokio::time::timeout(CALL_TIMEOUT, closed)
        .await
        .expect("closed within the timeout")
        .unwrap();
    let e = ended.expect_err("closed with an error");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "25P03");
    assert!(db.message().contains("rolled back"), "{}", db.message());
    let other = pg_connect(&cfg).await;
    let started = Instant::now();
    assert_eq!(
        one(&other, "SELECT count(*) FROM ses_rows WHERE id = -25003").await,
        "0"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the server connection came back: {:?}",
        started.elapsed()
    );
}

/// `query_timeout`: a statement the server has been silent on this long is
/// cancelled there (a CancelRequest); the client gets PostgreSQL's 57014 and
/// its session goes on. A pipeline of quick statements is never cut.
#[tokio::test]
async fn query_timeout_cancels_a_silent_statement_and_the_session_goes_on() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr()).extra("query_timeout = \"500ms\"");
    let (_p, cfg) = start(cfg);
    let client = pg_connect(&cfg).await;
    let started = Instant::now();
    let e = client
        .simple_query("SELECT pg_sleep(10)")
        .await
        .expect_err("cancelled");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "57014", "{}", db.message());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(one(&client, "SELECT 6 * 7").await, "42");
    // Quick statements, one after another for longer than the limit.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1200) {
        assert_eq!(
            one(&client, "SELECT pg_sleep(0.05)::text || 'x'").await,
            "x"
        );
    }
}

/// A database of the test's own on the shared cluster (other tests' server
/// connections would count otherwise).
fn own_database(name: &str) -> &str {
    let exists = cluster()
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
        ))
        .expect("look");
    if exists.trim() == "0" {
        cluster()
            .primary()
            .sql(&format!("CREATE DATABASE {name}"))
            .expect("create database");
    }
    name
}

/// Server connections to `db`, counted on the primary.
fn server_connections(db: &str) -> usize {
    let n = cluster()
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ))
        .expect("count");
    n.trim().parse().unwrap_or_else(|_| panic!("{n:?}"))
}

/// `min_pool_size` opens the pool's connections before clients need them;
/// `reserve_pool_size` serves a client that waited `reserve_pool_timeout`
/// when the pool is busy; past both, the client gets 53300 after
/// `pool_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_keeps_connections_open_and_the_reserve_serves_waiters() {
    let user = fulcrum_testkit::APP_TRUST_USER;
    let db = own_database("budget_min");
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(2)
        .extra("min_pool_size = 2")
        .extra("reserve_pool_size = 1")
        .extra("reserve_pool_timeout = \"300ms\"")
        .extra("pool_timeout = \"2s\"");
    let (_p, cfg) = start(cfg);
    let first = pg_connect_as(&cfg, user, db).await;
    one(&first, "SELECT 1").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while server_connections(db) < 2 {
        assert!(Instant::now() < deadline, "min_pool_size = 2 never reached");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two transactions hold the pool's two connections.
    let (a, b) = (
        pg_connect_as(&cfg, user, db).await,
        pg_connect_as(&cfg, user, db).await,
    );
    for c in [&a, &b] {
        exec(c, "BEGIN; SELECT txid_current()").await.unwrap();
    }
    // A connection the server is still tearing down may show for a moment.
    let settle = Instant::now() + Duration::from_secs(2);
    while server_connections(db) != 2 {
        assert!(
            Instant::now() < settle,
            "the warm ones were used, no more: {}",
            cluster()
                .primary()
                .sql(&format!("SELECT string_agg(pid || ' ' || state || ' ' || query || ' ' || backend_start, E'\\n') FROM pg_stat_activity WHERE datname = '{db}'"))
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    one(&first, "SELECT 2").await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1800),
        "served from the reserve after reserve_pool_timeout: {waited:?}"
    );
    assert_eq!(server_connections(db), 3, "one reserve connection");
    // The reserve held too: the next client waits pool_timeout and is told.
    exec(&first, "BEGIN; SELECT txid_current()").await.unwrap();
    let late = pg_connect_as(&cfg, user, db).await;
    let err = tokio::time::timeout(CALL_TIMEOUT, late.simple_query("SELECT 3"))
        .await
        .expect("answered")
        .unwrap_err();
    let e = err.as_db_error().expect("an ErrorResponse");
    assert_eq!(e.code().code(), "53300", "{e:?}");
    assert!(e.message().contains("pool of 2 is busy"), "{e:?}");
    for c in [&a, &b, &first] {
        exec(c, "COMMIT").await.unwrap();
    }
    assert!(server_connections(db) <= 3);
}

/// `max_db_connections` caps the server connections to one database across
/// users: at the cap a client of another user gets 53300 after
/// `pool_timeout`, naming the cap; once a connection is idle, the next
/// client closes it to make room instead of waiting for
/// `server_idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_db_connections_caps_connections_across_users() {
    use fulcrum_testkit::{APP_MD5_USER, APP_TRUST_USER};
    let db = own_database("budget_cap");
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(5)
        .extra("max_db_connections = 2")
        .extra("pool_timeout = \"1s\"");
    let (_p, cfg) = start(cfg);
    let a = pg_connect_as(&cfg, APP_TRUST_USER, db).await;
    let b = pg_connect_as(&cfg, APP_MD5_USER, db).await;
    for c in [&a, &b] {
        exec(c, "BEGIN; SELECT txid_current()").await.unwrap();
    }
    let c = pg_connect_as(&cfg, APP_TRUST_USER, db).await;
    let err = tokio::time::timeout(CALL_TIMEOUT, c.simple_query("SELECT 1"))
        .await
        .expect("answered")
        .unwrap_err();
    let e = err.as_db_error().expect("an ErrorResponse");
    assert_eq!(e.code().code(), "53300", "{e:?}");
    assert!(
        e.message()
            .contains(&format!("max_db_connections (2) for database \"{db}\"")),
        "{e:?}"
    );
    exec(&a, "COMMIT").await.unwrap();
    // The trust user's connection is idle now; the md5 user's next client
    // takes its place at once.
    let d = pg_connect_as(&cfg, APP_MD5_USER, db).await;
    let started = Instant::now();
    one(&d, "SELECT 4").await;
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "no wait for room"
    );
    // The connection closed to make room leaves pg_stat_activity when its
    // backend has exited, which a busy server may take a moment to do.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut total = server_connections(db);
    while total > 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        total = server_connections(db);
    }
    assert!(total <= 2, "{total} server connections to {db}");
    exec(&b, "COMMIT").await.unwrap();
}

/// `server_check_delay = "0s"` checks every idle connection with a round
/// trip before reuse: a live connection passes, so the client keeps being
/// served by the same server process, and the answers are unchanged. Each
/// check is counted in `fulcrum_server_checks_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_check_delay_checks_reused_connections_and_keeps_live_ones() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(1)
        .extra("server_check_delay = \"0s\"");
    let (_p, metrics_port) = start_with_metrics(&cfg.to_toml());
    let client = pg_connect(&cfg).await;
    let first = one(&client, "SELECT pg_backend_pid() + 0").await;
    for i in 0..20 {
        assert_eq!(one(&client, &format!("SELECT {i}")).await, i.to_string());
        assert_eq!(one(&client, "SELECT pg_backend_pid() + 0").await, first);
    }
    // 41 units on one pooled connection: every one after the first reused
    // it, checked. The counter is updated before the connection is handed
    // out, so all 40 are in.
    let passed = metric_sum(
        metrics_port,
        "fulcrum_server_checks_total",
        "outcome=\"passed\"",
    );
    assert!(passed >= 40, "40 checks passed, counted {passed}");
    assert_eq!(
        metric_sum(
            metrics_port,
            "fulcrum_server_checks_total",
            "outcome=\"failed\""
        ),
        0
    );
}

/// `min_pool_size` with `[[cluster.database]]` listed: the pools of every
/// configured user and listed database are opened at start, before any
/// client connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_warms_configured_users_and_databases_at_start() {
    let db = own_database("budget_warm");
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(3)
        .extra("min_pool_size = 2")
        // app_plain's server login is `password` (cleartext, on loopback).
        .extra("server_cleartext = true")
        .extra(&format!("[[cluster.database]]\nname = \"{db}\""));
    // `extra` lines go before the backends: the database table must not
    // swallow them, so it is moved to the end.
    let toml = cfg.to_toml();
    let (head, rest) = toml
        .split_once(&format!("[[cluster.database]]\nname = \"{db}\"\n"))
        .unwrap();
    let toml = format!("{head}{rest}\n[[cluster.database]]\nname = \"{db}\"\n");
    let _p = FulcrumProcess::start(&toml).expect("start fulcrum");
    let users = [
        APP_USER,
        fulcrum_testkit::APP_MD5_USER,
        fulcrum_testkit::APP_PLAIN_USER,
        fulcrum_testkit::APP_TRUST_USER,
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let per_user = cluster()
            .primary()
            .sql(&format!(
                "SELECT string_agg(usename || '=' || n, ',' ORDER BY usename) FROM \
                 (SELECT usename, count(*) AS n FROM pg_stat_activity WHERE datname = '{db}' GROUP BY usename) s"
            ))
            .unwrap();
        let warm = users
            .iter()
            .all(|u| per_user.split(',').any(|e| e == format!("{u}=2")));
        if warm {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every configured user's pool warmed to 2 without a client: {per_user:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `function_catalog` (default on): a read calling a user function that no
/// list names is routed by the server's `pg_proc.provolatile`: a volatile
/// one that writes runs on the primary (on a replica it would fail with
/// 25006), a stable one goes to the replicas once looked up. With the
/// catalog off, the writing one reaches a replica and fails: the catalog is
/// what routes it. (Both are listed in `session_free_functions`; unlisted,
/// a call pins its client to the primary: pg_isolation.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_are_routed_by_the_servers_catalog() {
    let c = cluster();
    c.primary()
        .sql_script(
            APP_DB,
            "CREATE TABLE IF NOT EXISTS bumps (n int);
             GRANT ALL ON bumps TO PUBLIC;
             CREATE OR REPLACE FUNCTION bump() RETURNS int LANGUAGE sql VOLATILE
               AS $$ INSERT INTO bumps VALUES (1) RETURNING n $$;
             CREATE OR REPLACE FUNCTION price(x int) RETURNS int LANGUAGE sql STABLE
               AS $$ SELECT x * 2 $$;",
        )
        .expect("functions");
    c.wait_replicas_caught_up(Duration::from_secs(30))
        .expect("replicated");
    let primary = c.primary().port().to_string();
    // Declared free of session state: only then may a call go unpinned
    // (default-deny), and the catalog route it.
    let free = r#"session_free_functions = ["bump", "price"]"#;
    let cfg = with_replicas(5).extra(free);
    let (_p, metrics_port) = start_with_metrics(&cfg.to_toml());
    let client = pg_connect(&cfg).await;
    for _ in 0..6 {
        assert_eq!(
            one(&client, "SELECT bump()").await,
            "1",
            "a writing function runs on the primary"
        );
    }
    // Unknown at first (the primary), a read once the catalog answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let port = one(&client, "SELECT inet_server_port() + price(0)").await;
        if port != primary {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a stable function never reached a replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let loaded = metric_sum(
        metrics_port,
        "fulcrum_function_catalog_lookups_total",
        "outcome=\"loaded\"",
    );
    assert!(loaded >= 1, "the lookup that routed price() is counted");
    let (_off, cfg) = start(
        with_replicas(5)
            .extra("function_catalog = false")
            .extra(free),
    );
    let client = pg_connect(&cfg).await;
    let err = exec(&client, "SELECT bump()").await.unwrap_err();
    assert_eq!(
        err.as_db_error().map(|d| d.code().code()),
        Some("25006"),
        "without the catalog it reaches a read-only replica: {err:?}"
    );
}

/// A pinned client that leaves in transaction pooling (a temporary table,
/// an advisory lock, an SQL PREPARE, a LISTEN) leaves nothing on the one
/// server connection the next client is given.
#[tokio::test]
async fn a_pinned_client_leaves_nothing_for_the_next_client() {
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()).pool_size(1));
    {
        let pinned = pg_connect(&cfg).await;
        exec(
            &pinned,
            "CREATE TEMP TABLE leak_tmp (x int); SELECT pg_advisory_lock(4242); \
             PREPARE leak_stmt AS SELECT 1; LISTEN leak_channel",
        )
        .await
        .unwrap();
        let pid = one(&pinned, "SELECT pg_backend_pid() + 0").await;
        assert_eq!(
            one(&pinned, "SELECT pg_backend_pid() + 0").await,
            pid,
            "pinned"
        );
    }
    // The client is gone once its socket is closed; the next one may be
    // served before Fulcrum has noticed, so it asks until the connection
    // it gets is the clean one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let next = pg_connect(&cfg).await;
        let locks = one(
            &next,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242",
        )
        .await;
        let tmp = one(&next, "SELECT count(*) FROM pg_class WHERE relname = 'leak_tmp' AND relpersistence = 't' AND pg_table_is_visible(oid)").await;
        let prepared = one(&next, "SELECT count(*) FROM pg_prepared_statements").await;
        let listening = one(&next, "SELECT count(*) FROM pg_listening_channels()").await;
        if (
            locks.as_str(),
            tmp.as_str(),
            prepared.as_str(),
            listening.as_str(),
        ) == ("0", "0", "0", "0")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left for the next client: advisory locks {locks}, temporary table {tmp}, prepared {prepared}, listening {listening}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `set_config(name, value, false)` is a SET by another name (how
/// row-level-security apps set their tenant): it follows its client to
/// every connection it uses and never reaches the next client of the
/// pooled connection; `set_config(..., true)` lasts only its transaction.
#[tokio::test]
async fn set_config_follows_its_client_and_never_the_next_one() {
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()).pool_size(2));
    let tenant = "SELECT coalesce(current_setting('app.tenant', true), '')";
    {
        let a = pg_connect(&cfg).await;
        assert_eq!(
            one(&a, "SELECT set_config('app.tenant', '42', false)").await,
            "42"
        );
        for _ in 0..4 {
            assert_eq!(one(&a, tenant).await, "42", "the client keeps its setting");
        }
        exec(
            &a,
            "BEGIN; SELECT set_config('app.local', '7', true); COMMIT",
        )
        .await
        .unwrap();
    }
    // 20 later clients of the same user, on the same two connections.
    for i in 0..20 {
        let next = pg_connect(&cfg).await;
        assert_eq!(one(&next, tenant).await, "", "client {i} saw the tenant");
        assert_eq!(
            one(
                &next,
                "SELECT coalesce(current_setting('app.local', true), '')"
            )
            .await,
            "",
            "client {i} saw a transaction-local setting"
        );
    }
}

/// A unit over `max_classify_bytes` is not parsed: unless it is plainly one
/// read or write it pins its client, so what it does to the session (here a
/// `SET` behind a padded `SELECT`) is reset when the client leaves and never
/// reaches the next client of the connection.
#[tokio::test]
async fn an_oversized_unit_that_changes_the_session_pins_and_leaves_nothing() {
    let (_p, cfg) = start(
        PgProxyConfig::new(&cluster().primary().addr())
            .pool_size(1)
            .extra("max_classify_bytes = \"1kB\""),
    );
    let pad = "x".repeat(2000);
    {
        let a = pg_connect(&cfg).await;
        exec(
            &a,
            &format!("SELECT '{pad}'; SET search_path = leak_schema, public"),
        )
        .await
        .unwrap();
        assert_eq!(one(&a, "SHOW search_path").await, "leak_schema, public");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let next = pg_connect(&cfg).await;
        let path = one(&next, "SHOW search_path").await;
        if path == "\"$user\", public" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left for the next client: search_path {path}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A server that asks for the password in clear text (`password` in its
/// pg_hba.conf) gets it only when `server_cleartext = true` (off by
/// default) and the link cannot be intercepted (here loopback; else a Unix
/// socket or TLS with a verified certificate). By default the login fails
/// with an error that names the key.
#[tokio::test]
async fn a_cleartext_password_is_sent_only_when_allowed() {
    let plain = fulcrum_testkit::APP_PLAIN_USER;
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()));
    let err = match fulcrum_suite::try_pg_connect_as(&cfg, plain, APP_DB).await {
        Ok(client) => match client.simple_query("SELECT 1").await {
            Ok(_) => panic!("the password went out in clear text by default"),
            Err(e) => e,
        },
        Err(e) => e,
    };
    let message = err
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| err.to_string());
    assert!(message.contains("server_cleartext"), "{message}");
    let (_q, cfg) =
        start(PgProxyConfig::new(&cluster().primary().addr()).extra("server_cleartext = true"));
    let client = fulcrum_suite::pg_connect_as(&cfg, plain, APP_DB).await;
    assert_eq!(one(&client, "SELECT current_user").await, plain);
}

/// `server_reset_query` (PgBouncer's key): what runs on a session-pooled
/// connection going back. The default, `DISCARD ALL`, drops a client's SQL
/// prepared statements; `RESET ALL` (configured here) keeps them, which the
/// next client of the connection sees. `server_reset_query_always` runs it
/// on every return in transaction pooling too: the statements Fulcrum
/// prepared on the connection are gone before the next unit.
#[tokio::test]
async fn server_reset_query_is_what_runs_when_a_connection_goes_back() {
    let count = "SELECT count(*) FROM pg_prepared_statements";
    for (reset, left) in [(None, "0"), (Some("RESET ALL"), "1")] {
        let mut cfg = PgProxyConfig::new(&cluster().primary().addr())
            .pool_mode("session")
            .pool_size(1);
        if let Some(q) = reset {
            cfg = cfg.extra(&format!("server_reset_query = \"{q}\""));
        }
        let (_p, cfg) = start(cfg);
        {
            let a = pg_connect(&cfg).await;
            exec(&a, "PREPARE kept AS SELECT 1").await.unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let next = pg_connect(&cfg).await;
            let n = one(&next, count).await;
            if n == left {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "server_reset_query {reset:?}: {n} prepared statements left, expected {left}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (always, at_least_one) in [(false, true), (true, false)] {
        let (_p, cfg) = start(
            PgProxyConfig::new(&cluster().primary().addr())
                .pool_size(1)
                .extra(&format!("server_reset_query_always = {always}")),
        );
        let a = pg_connect(&cfg).await;
        let stmt = a.prepare("SELECT 41 + 1").await.unwrap();
        let row = a.query_one(&stmt, &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 42);
        let n: i64 = one(&a, count).await.parse().unwrap();
        assert_eq!(
            n >= 1,
            at_least_one,
            "server_reset_query_always = {always}: {n}"
        );
    }
}
