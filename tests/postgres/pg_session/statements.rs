//! Prepared statements and protocol messages: DEALLOCATE answered without a
//! server, server messages over `max_message_size`, a held client not read
//! without bound, answers Fulcrum owes, and the statement registry and its
//! bound.

use std::time::{Duration, Instant};

use fulcrum_suite::{metric_sum, pg_connect, rss_kb, with_metrics, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, APP_DB, APP_USER};

use super::helpers::{cluster, exec, one, start, with_replicas, CALL_TIMEOUT};

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
async fn a_server_message_over_max_message_size_closes_that_connection() {
    // The login waits for the function catalog: `repeat` read before it
    // pins the client (default-deny), and a pinned client's session ends
    // with its connection (08006), which is not what is looked at here.
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(2)
        .extra("max_message_size = \"1MB\"")
        .extra("function_catalog_wait = \"10s\"");
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
