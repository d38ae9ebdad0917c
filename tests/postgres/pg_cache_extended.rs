//! The result cache (issue 46) for the unnamed statement's extended-protocol
//! unit (Parse "" / Bind / Describe / Execute / Sync), through a real
//! Fulcrum in front of `pg_cache`'s primary: tokio-postgres `query_typed`,
//! pgbench `-M extended` and a raw client. A repeated read is answered from
//! the cache (a write behind Fulcrum's back stays unseen,
//! `invalidation = "proxy"`, and SHOW CACHE counts the hits) until a write
//! through Fulcrum (an unnamed statement's write drops only its tables);
//! parameter values, result formats and what is described
//! never share an entry; and a later Bind of the unnamed statement without a
//! Parse runs the client's own statement, wherever it lands.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{run_pgbench, FulcrumProcess, APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::pg_cache::{
    behind_its_back, cache_config, cluster, run, show_cache, start_console, value,
};
use crate::pg_session::raw_client;

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const READ: &str = "SELECT v FROM cache_ext_t WHERE id = $1";

/// Fulcrum keeping reads of `cache_ext_t` and `cache_ext_u` (this module's
/// tables), with the
/// console on the returned port; `raw`: trust logins on one server
/// connection, for the raw client.
fn start(raw: bool) -> (FulcrumProcess, PgProxyConfig, u16) {
    static TABLE: OnceLock<()> = OnceLock::new();
    TABLE.get_or_init(|| {
        cluster()
            .primary()
            .sql_script(
                APP_DB,
                "CREATE TABLE IF NOT EXISTS cache_ext_t (id int PRIMARY KEY, v int);
                 INSERT INTO cache_ext_t SELECT i, i FROM generate_series(1, 100) i
                 ON CONFLICT DO NOTHING;
                 CREATE TABLE IF NOT EXISTS cache_ext_u (id int PRIMARY KEY, v int);
                 INSERT INTO cache_ext_u VALUES (1, 1) ON CONFLICT DO NOTHING;",
            )
            .expect("set up");
    });
    let cfg = cache_config("\"cache_ext_t\", \"cache_ext_u\"", "user", "proxy");
    let cfg = match raw {
        true => cfg.client_auth("trust").pool_size(1),
        false => cfg,
    };
    start_console(cfg)
}

/// `v` of row `id` read with the unnamed statement (tokio-postgres
/// `query_typed`: Parse "", Bind, Describe 'S', Execute, Sync; binary
/// results).
async fn typed_v(client: &Client, id: i32) -> i32 {
    let rows = tokio::time::timeout(CALL_TIMEOUT, client.query_typed(READ, &[(&id, Type::INT4)]))
        .await
        .expect("bounded")
        .unwrap_or_else(|e| panic!("{READ}: {e} {:?}", e.as_db_error()));
    rows[0].get(0)
}

/// Hits SHOW CACHE counts for the digest reading `cache_ext_t`.
async fn hits(admin: u16) -> u64 {
    show_cache(admin)
        .await
        .iter()
        .filter(|r| r.0.contains("cache_ext_t"))
        .map(|r| r.2)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_statement_read_is_answered_from_the_cache_until_a_write_through_fulcrum() {
    let (_p, cfg, admin) = start(false);
    let a = pg_connect(&cfg).await;
    let b = pg_connect(&cfg).await;
    run(&a, "UPDATE cache_ext_t SET v = 1 WHERE id = 1").await;
    assert_eq!(typed_v(&a, 1).await, 1);
    behind_its_back("UPDATE cache_ext_t SET v = 100 WHERE id = 1");
    assert_eq!(typed_v(&a, 1).await, 1, "answered from the cache");
    assert_eq!(typed_v(&b, 1).await, 1, "the same user's other client too");
    assert_eq!(hits(admin).await, 2, "SHOW CACHE counts both hits");
    // Another parameter value is another entry.
    assert_eq!(typed_v(&a, 2).await, 2, "not the entry of id 1");
    // A write through Fulcrum with the unnamed statement: seen at once.
    let n = a
        .execute_typed(
            "UPDATE cache_ext_t SET v = $1 WHERE id = 1",
            &[(&3i32, Type::INT4)],
        )
        .await
        .expect("update");
    assert_eq!(n, 1);
    assert_eq!(typed_v(&a, 1).await, 3);
    assert_eq!(typed_v(&b, 1).await, 3);
    // And a simple one.
    run(&b, "UPDATE cache_ext_t SET v = 4 WHERE id = 1").await;
    assert_eq!(typed_v(&a, 1).await, 4);
    behind_its_back("UPDATE cache_ext_t SET v = 400 WHERE id = 1");
    assert_eq!(typed_v(&b, 1).await, 4, "kept again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_statement_write_drops_only_the_tables_it_names() {
    let (_p, cfg, _) = start(false);
    let a = pg_connect(&cfg).await;
    let other = "SELECT v FROM cache_ext_u WHERE id = 1";
    let kept = value(&a, other).await;
    assert_eq!(typed_v(&a, 9).await, 9);
    behind_its_back("UPDATE cache_ext_u SET v = v + 1; UPDATE cache_ext_t SET v = 90 WHERE id = 9");
    assert_eq!(value(&a, other).await, kept, "kept");
    assert_eq!(typed_v(&a, 9).await, 9, "kept");
    a.execute_typed(
        "UPDATE cache_ext_t SET v = v + $1 WHERE id = 9",
        &[(&1i32, Type::INT4)],
    )
    .await
    .expect("update");
    assert_eq!(typed_v(&a, 9).await, 91, "its table's entries dropped");
    assert_eq!(value(&a, other).await, kept, "another table's kept");
}

#[test]
fn pgbench_extended_reads_are_answered_from_the_cache() {
    let (_p, cfg, admin) = start(false);
    let script = std::env::temp_dir().join(format!("fulcrum_cache_ext_{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "\\set id random(1, 10)\nSELECT v FROM cache_ext_t WHERE id = :id;\n",
    )
    .expect("script");
    let script_arg = script.to_str().expect("a UTF-8 path");
    let args = [
        "-n", "-M", "extended", "-f", script_arg, "-c", "2", "-j", "2", "-t", "200",
    ];
    let s = run_pgbench(&cfg.listen, APP_USER, APP_PASSWORD, APP_DB, &args).expect("pgbench");
    let _ = std::fs::remove_file(&script);
    assert_eq!(s.failed, 0, "{}", s.stdout);
    assert_eq!(s.transactions, 400);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let hits = rt.block_on(hits(admin));
    // Ten keys: each misses once (twice if both clients miss it at once).
    assert!(hits >= 380, "400 reads of 10 keys, {hits} hits");
}

fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut f = vec![tag];
    f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// Parse of the unnamed statement `sql`, its one parameter an int4.
fn parse(sql: &str) -> Vec<u8> {
    frame(
        b'P',
        &[b"\0", sql.as_bytes(), b"\0\0\x01\0\0\0\x17"].concat(),
    )
}

/// Bind of the unnamed statement to the unnamed portal, with one text
/// parameter and one result column in `format` (0 text, 1 binary).
fn bind(value: &str, format: u8) -> Vec<u8> {
    let mut body = b"\0\0\0\0\0\x01".to_vec();
    body.extend_from_slice(&(value.len() as u32).to_be_bytes());
    body.extend_from_slice(value.as_bytes());
    body.extend_from_slice(&[0, 1, 0, format]);
    frame(b'B', &body)
}

fn describe(kind: u8) -> Vec<u8> {
    frame(b'D', &[kind, 0])
}

fn execute() -> Vec<u8> {
    frame(b'E', b"\0\0\0\0\0")
}

const SYNC: &[u8] = b"S\0\0\0\x04";

/// The server frames up to ReadyForQuery, byte for byte.
fn answer(s: &mut TcpStream) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    loop {
        let mut header = [0u8; 5];
        s.read_exact(&mut header).expect("an answer");
        let len = u32::from_be_bytes(header[1..5].try_into().unwrap()) as usize - 4;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).expect("its body");
        frames.push((header[0], body));
        if header[0] == b'Z' {
            return frames;
        }
    }
}

/// Sends `frames`; the answer's frames.
fn exchange(s: &mut TcpStream, frames: &[Vec<u8>]) -> Vec<(u8, Vec<u8>)> {
    s.write_all(&frames.concat()).unwrap();
    answer(s)
}

/// The first column of the first DataRow, as sent.
fn first_value(frames: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let (_, row) = frames
        .iter()
        .find(|(t, _)| *t == b'D')
        .unwrap_or_else(|| panic!("no row in {frames:?}"));
    let len = u32::from_be_bytes(row[2..6].try_into().unwrap()) as usize;
    row[6..6 + len].to_vec()
}

fn tags(frames: &[(u8, Vec<u8>)]) -> String {
    frames.iter().map(|(t, _)| *t as char).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_formats_values_and_describes_never_share_an_entry() {
    let (_p, cfg, admin) = start(true);
    behind_its_back(
        "UPDATE cache_ext_t SET v = 5 WHERE id = 5; UPDATE cache_ext_t SET v = 6 WHERE id = 6",
    );
    let mut c = raw_client(&cfg);
    let unit = |value: &str, format: u8, described: Option<u8>| {
        let mut frames = vec![parse(READ), bind(value, format)];
        frames.extend(described.map(describe));
        frames.extend([execute(), SYNC.to_vec()]);
        frames
    };
    let cases = [
        ("5", 0, Some(b'P'), "12TDCZ", b"5".to_vec()),
        ("5", 1, Some(b'P'), "12TDCZ", vec![0, 0, 0, 5]),
        ("6", 0, Some(b'P'), "12TDCZ", b"6".to_vec()),
        ("5", 0, Some(b'S'), "12tTDCZ", b"5".to_vec()),
        ("5", 0, None, "12DCZ", b"5".to_vec()),
    ];
    let mut first = Vec::new();
    for (value, format, described, shape, expect) in &cases {
        let got = exchange(&mut c, &unit(value, *format, *described));
        assert_eq!(tags(&got), *shape, "{value} {format} {described:?}");
        assert_eq!(&first_value(&got), expect, "{value} {format} {described:?}");
        first.push(got);
    }
    // Behind Fulcrum's back: every kept answer is served as it was.
    behind_its_back(
        "UPDATE cache_ext_t SET v = 50 WHERE id = 5; UPDATE cache_ext_t SET v = 60 WHERE id = 6",
    );
    for ((value, format, described, ..), kept) in cases.iter().zip(&first) {
        let got = exchange(&mut c, &unit(value, *format, *described));
        assert_eq!(&got, kept, "{value} {format} {described:?}: byte for byte");
    }
    assert_eq!(hits(admin).await, cases.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_of_the_unnamed_statement_without_a_parse_runs_the_clients_own_statement() {
    // One server connection, which the other client's unnamed statement
    // takes over between the two.
    let (_p, cfg, admin) = start(true);
    behind_its_back("UPDATE cache_ext_t SET v = 7 WHERE id = 7");
    let mut a = raw_client(&cfg);
    let mut b = raw_client(&cfg);
    let read = [parse(READ), bind("7", 0), execute(), SYNC.to_vec()];
    assert_eq!(first_value(&exchange(&mut a, &read)), b"7");
    behind_its_back("UPDATE cache_ext_t SET v = 70 WHERE id = 7");
    assert_eq!(first_value(&exchange(&mut a, &read)), b"7", "a hit");
    assert_eq!(hits(admin).await, 1);
    let other = [
        parse("SELECT $1::int + 1000"),
        bind("7", 0),
        execute(),
        SYNC.to_vec(),
    ];
    assert_eq!(first_value(&exchange(&mut b, &other)), b"1007");
    // a binds its unnamed statement again, with no Parse: its own, run on
    // the server (not a cached answer: a Bind alone is not looked up).
    let again = exchange(&mut a, &[bind("7", 0), execute(), SYNC.to_vec()]);
    assert_eq!(tags(&again), "2DCZ", "its Parse's reply is not shown");
    assert_eq!(first_value(&again), b"70");
    // Described alone: its parameter is the int4 of a's statement.
    b.write_all(&[other[0].clone(), SYNC.to_vec()].concat())
        .unwrap();
    answer(&mut b);
    let described = exchange(&mut a, &[describe(b'S'), SYNC.to_vec()]);
    assert_eq!(tags(&described), "tTZ");
    let (_, params) = &described[0];
    assert_eq!(params[..6], [0, 1, 0, 0, 0, 0x17], "one int4 parameter");
    let (_, row) = &described[1];
    assert!(row.windows(2).any(|w| w == b"v\0"), "a's column v: {row:?}");
}
