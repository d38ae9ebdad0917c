//! Criterion micro-benchmarks of Fulcrum's data-path building blocks, through
//! the crates' public APIs: the PostgreSQL and MySQL codecs, the statement
//! classifier (cache hit vs parse), the read balancer and the connection pool.
//! No database is needed.
//!
//! ```text
//! CARGO_TARGET_DIR=/tmp/micro-target cargo bench --bench micro -- \
//!     --warm-up-time 1 --measurement-time 2
//! ```
//!
//! `cargo test --bench micro` runs every benchmark once, as a smoke test.
//! Results and their reading are in docs/benchmarks-history.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use fulcrum_mysql::codec::packet::{scan_message, write_packet};
use fulcrum_mysql::codec::response::{
    build_ok, build_ok_as_eof, classify, encode_session_state, last_gtid, parse_ok,
    parse_session_state, OkPacket, ResponseKind, SessionChange,
};
use fulcrum_mysql::codec::wire::{write_lenenc_int, write_lenenc_str};
use fulcrum_mysql::{CapabilityFlags as Caps, StatusFlags as Status};
use fulcrum_pool::{Balance, Pool, Poolable, Route, Router};
use fulcrum_postgres::codec::backend_msg::{command_complete, ready_for_query};
use fulcrum_postgres::codec::check_frame;
use fulcrum_postgres::codec::frame::put_header;
use fulcrum_postgres::codec::frontend_msg::{bind_msg, parse_msg, query_text};
use fulcrum_sql::{Classifier, ClassifierConfig, Decision, Dialect};

/// Rows in the result sets the framing benchmarks walk.
const ROWS: usize = 1_000;
/// The frame/packet size limit the codecs are given (1 GiB, as PostgreSQL's).
const MAX: usize = 1 << 30;

// ---------------------------------------------------------------- PostgreSQL

/// The three text columns of row `i`: an id, a name and a balance.
fn row_values(i: usize) -> [String; 3] {
    [
        i.to_string(),
        format!("customer-{i:05}"),
        format!("{}.{:02}", i * 7 % 10_000, i % 100),
    ]
}

/// `ROWS` DataRow frames of 3 text columns, back to back, as a server sends them.
fn pg_data_rows() -> BytesMut {
    let mut out = BytesMut::new();
    for i in 0..ROWS {
        let cols = row_values(i);
        let body_len = 2 + cols.iter().map(|c| 4 + c.len()).sum::<usize>();
        put_header(&mut out, b'D', body_len);
        out.put_i16(cols.len() as i16);
        for c in &cols {
            out.put_i32(c.len() as i32);
            out.extend_from_slice(c.as_bytes());
        }
    }
    out
}

/// Walks `buf` frame by frame as the session loop does; returns the frame count.
fn walk_pg_frames(buf: &[u8]) -> usize {
    let mut at = 0;
    let mut frames = 0;
    while let Ok(Some(h)) = check_frame(&buf[at..], MAX as u64) {
        if buf.len() - at < h.total {
            break;
        }
        at += h.total;
        frames += 1;
    }
    frames
}

/// Body of a simple Query message.
fn query_body(sql: &str) -> Vec<u8> {
    let mut b = sql.as_bytes().to_vec();
    b.push(0);
    b
}

/// Body of a Parse message: a named statement with two int4 parameters.
fn parse_body() -> Vec<u8> {
    let mut b = BytesMut::new();
    b.extend_from_slice(b"fulcrum_s1\0");
    b.extend_from_slice(b"SELECT id, name, balance FROM accounts WHERE id = $1 AND branch = $2\0");
    b.put_i16(2);
    b.put_i32(23);
    b.put_i32(23);
    b.to_vec()
}

/// Body of a Bind message for that statement: two text parameters, text results.
fn bind_body() -> Vec<u8> {
    let mut b = BytesMut::new();
    b.extend_from_slice(b"\0fulcrum_s1\0");
    b.put_i16(0); // parameter formats: all text
    b.put_i16(2);
    for p in [&b"12345"[..], b"7"] {
        b.put_i32(p.len() as i32);
        b.extend_from_slice(p);
    }
    b.put_i16(0); // result formats: all text
    b.to_vec()
}

fn bench_pg_codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("pg_codec");

    let rows = pg_data_rows();
    assert_eq!(walk_pg_frames(&rows), ROWS);
    g.throughput(Throughput::Bytes(rows.len() as u64));
    g.bench_function("check_frame/1000_datarows_3col", |b| {
        b.iter(|| walk_pg_frames(black_box(&rows)))
    });

    g.throughput(Throughput::Elements(1));
    let q = query_body("SELECT abalance FROM pgbench_accounts WHERE aid = 48213");
    assert!(query_text(&q).is_some());
    g.bench_function("query_text", |b| b.iter(|| query_text(black_box(&q))));

    let p = parse_body();
    assert!(parse_msg(&p).is_some());
    g.bench_function("parse_msg", |b| b.iter(|| parse_msg(black_box(&p))));

    let bi = bind_body();
    assert_eq!(bind_msg(&bi).unwrap().statement, b"fulcrum_s1");
    g.bench_function("bind_msg", |b| b.iter(|| bind_msg(black_box(&bi))));

    // Encoding into a buffer that is cleared, not reallocated, per iteration.
    let mut out = BytesMut::with_capacity(64);
    g.bench_function("encode/ready_for_query", |b| {
        b.iter(|| {
            out.clear();
            ready_for_query(&mut out, black_box(b'I'));
            black_box(out.len())
        })
    });
    g.bench_function("encode/command_complete", |b| {
        b.iter(|| {
            out.clear();
            command_complete(&mut out, black_box("SELECT 1"));
            black_box(out.len())
        })
    });
    g.finish();
}

// ---------------------------------------------------------------------- MySQL

/// Negotiated capabilities of a modern client: 4.1 protocol, session
/// tracking, OK instead of EOF.
const TRACK: Caps = Caps::CLIENT_PROTOCOL_41
    .union(Caps::CLIENT_SESSION_TRACK)
    .union(Caps::CLIENT_DEPRECATE_EOF);

/// A Protocol::ColumnDefinition41 payload for a VARCHAR column.
fn column_definition(name: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for s in ["def", "shop", "accounts", "accounts", name, name] {
        write_lenenc_str(&mut p, s.as_bytes());
    }
    write_lenenc_int(&mut p, 0x0c);
    p.extend_from_slice(&45u16.to_le_bytes()); // utf8mb4_general_ci
    p.extend_from_slice(&255u32.to_le_bytes());
    p.push(0xfd); // VAR_STRING
    p.extend_from_slice(&0u16.to_le_bytes());
    p.push(0);
    p.extend_from_slice(&[0, 0]);
    p
}

/// A text-protocol result set under `DEPRECATE_EOF`: column count, 3 column
/// definitions, `ROWS` rows of 3 columns, then the OK-as-EOF.
fn mysql_result_set() -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut seq = 1u8;
    let mut packets = 0;
    let mut put = |out: &mut Vec<u8>, payload: &[u8]| {
        seq = write_packet(out, seq, payload);
        packets += 1;
    };
    put(&mut out, &[3]);
    for name in ["id", "name", "balance"] {
        put(&mut out, &column_definition(name));
    }
    for i in 0..ROWS {
        let mut row = Vec::new();
        for v in row_values(i) {
            write_lenenc_str(&mut row, v.as_bytes());
        }
        put(&mut out, &row);
    }
    let end = build_ok_as_eof(
        &OkPacket {
            status: Status::SERVER_STATUS_AUTOCOMMIT,
            ..OkPacket::default()
        },
        TRACK,
    );
    put(&mut out, &end);
    (out, packets)
}

/// Walks `buf` message by message as the session loop does; returns the count.
fn walk_mysql_messages(buf: &[u8]) -> usize {
    let mut at = 0;
    let mut messages = 0;
    while let Ok(Some(span)) = scan_message(&buf[at..], MAX) {
        at += span.total;
        messages += 1;
    }
    messages
}

/// The OK of a COMMIT on MariaDB with `session_track_system_variables=last_gtid`
/// and transaction-state tracking: what Fulcrum reads a write's GTID from.
fn ok_with_session_state() -> Vec<u8> {
    let state = encode_session_state(&[
        SessionChange::SystemVariable {
            name: b"last_gtid",
            value: b"0-1-48213",
        },
        SessionChange::TransactionState(b"________"),
    ]);
    build_ok(
        &OkPacket {
            status: Status::SERVER_STATUS_AUTOCOMMIT | Status::SERVER_SESSION_STATE_CHANGED,
            session_state: &state,
            ..OkPacket::default()
        },
        TRACK,
    )
}

fn bench_mysql_codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("mysql_codec");

    let (rs, packets) = mysql_result_set();
    assert_eq!(walk_mysql_messages(&rs), packets);
    g.throughput(Throughput::Bytes(rs.len() as u64));
    g.bench_function("scan_message/1000_rows_3col", |b| {
        b.iter(|| walk_mysql_messages(black_box(&rs)))
    });

    g.throughput(Throughput::Elements(1));
    let ok = ok_with_session_state();
    let parsed = parse_ok(&ok, TRACK).unwrap();
    assert!(!parsed.session_state.is_empty());
    g.bench_function("parse_ok/session_state", |b| {
        b.iter(|| parse_ok(black_box(&ok), TRACK))
    });
    // What the reply reader does with it: the OK, its state, the GTID.
    g.bench_function("parse_ok+last_gtid", |b| {
        b.iter(|| {
            let ok = parse_ok(black_box(&ok), TRACK).unwrap();
            let changes = parse_session_state(ok.session_state).unwrap();
            last_gtid(&changes).map(<[u8]>::len)
        })
    });

    let firsts: [(&str, &[u8], ResponseKind); 3] = [
        ("ok", &ok, ResponseKind::Ok),
        (
            "err",
            b"\xff\x28\x04#42S02Table 'shop.nope' doesn't exist",
            ResponseKind::Err,
        ),
        ("result_set", &[3], ResponseKind::ResultSet { columns: 3 }),
    ];
    for (name, payload, want) in firsts {
        assert_eq!(classify(payload), Ok(want));
        g.bench_function(BenchmarkId::new("classify", name), |b| {
            b.iter(|| classify(black_box(payload)))
        });
    }
    g.finish();
}

// ----------------------------------------------------------------- Classifier

const PG_STATEMENTS: [(&str, &str); 11] = [
    (
        "point_select",
        "SELECT abalance FROM pgbench_accounts WHERE aid = 48213",
    ),
    (
        "select_in",
        "SELECT id, name, email FROM users WHERE id IN (1, 2, 3) AND active",
    ),
    (
        "join",
        "SELECT o.id, o.total, c.name FROM orders o JOIN customers c ON c.id = o.customer_id \
         WHERE o.created_at > '2024-01-01' ORDER BY o.id DESC LIMIT 20",
    ),
    (
        "aggregate",
        "SELECT count(*), sum(total) FROM orders WHERE customer_id = 7",
    ),
    (
        "insert",
        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) \
         VALUES (3, 1, 48213, -2417, CURRENT_TIMESTAMP)",
    ),
    (
        "update",
        "UPDATE pgbench_accounts SET abalance = abalance + -2417 WHERE aid = 48213",
    ),
    ("delete", "DELETE FROM sessions WHERE expires_at < now()"),
    (
        "select_for_update",
        "SELECT * FROM jobs WHERE id = 9 FOR UPDATE",
    ),
    ("begin", "BEGIN"),
    ("commit", "COMMIT"),
    ("set", "SET search_path TO app, public"),
];

const MYSQL_STATEMENTS: [(&str, &str); 11] = [
    ("point_select", "SELECT c FROM sbtest1 WHERE id = 4821"),
    (
        "select_in",
        "SELECT id, name, email FROM users WHERE id IN (1, 2, 3) AND active = 1",
    ),
    (
        "join",
        "SELECT o.id, o.total, c.name FROM orders o JOIN customers c ON c.id = o.customer_id \
         WHERE o.created_at > '2024-01-01' ORDER BY o.id DESC LIMIT 20",
    ),
    (
        "aggregate",
        "SELECT COUNT(*), SUM(total) FROM orders WHERE customer_id = 7",
    ),
    (
        "insert",
        "INSERT INTO sbtest1 (id, k, c, pad) VALUES (4821, 5013, '6836-3939', '2217-8894')",
    ),
    ("update", "UPDATE sbtest1 SET k = k + 1 WHERE id = 4821"),
    ("delete", "DELETE FROM sbtest1 WHERE id = 4821"),
    (
        "select_for_update",
        "SELECT * FROM jobs WHERE id = 9 FOR UPDATE",
    ),
    ("begin", "START TRANSACTION"),
    ("commit", "COMMIT"),
    ("set", "SET autocommit = 1"),
];

fn classifier(dialect: Dialect, cache_size: usize) -> Classifier {
    Classifier::new(
        dialect,
        &ClassifierConfig {
            cache_size,
            ..ClassifierConfig::default()
        },
    )
}

fn bench_classifier(c: &mut Criterion) {
    let mut g = c.benchmark_group("classifier");
    for (dialect, tag, statements) in [
        (Dialect::Postgres, "pg", &PG_STATEMENTS),
        (Dialect::MySql, "mysql", &MYSQL_STATEMENTS),
    ] {
        let cached = classifier(dialect, 10_000);
        let uncached = classifier(dialect, 0);
        // Warm the cache, and check both give the same decisions.
        for (name, sql) in statements {
            let d = cached.classify(sql);
            assert_eq!(d, uncached.classify(sql), "{tag} {name}");
            assert_ne!(d, Decision::Unknown, "{tag} {name}: {sql}");
        }
        g.throughput(Throughput::Elements(statements.len() as u64));
        for (mode, cl) in [("cached", &cached), ("uncached", &uncached)] {
            g.bench_function(format!("{tag}/{mode}/mix_of_{}", statements.len()), |b| {
                b.iter(|| {
                    for (_, sql) in statements {
                        black_box(cl.classify(black_box(sql)));
                    }
                })
            });
        }
        // Statement by statement, for PostgreSQL only (the costs are alike).
        if dialect == Dialect::Postgres {
            g.throughput(Throughput::Elements(1));
            for (name, sql) in statements {
                for (mode, cl) in [("cached", &cached), ("uncached", &uncached)] {
                    g.bench_function(format!("{tag}/{mode}/{name}"), |b| {
                        b.iter(|| cl.classify(black_box(sql)))
                    });
                }
            }
        }
        let s = cached.stats();
        assert!(s.hits > 0 && s.unparsed == 0, "{tag}: {s:?}");
    }
    g.finish();
}

// ------------------------------------------------------------------- Balancer

fn bench_router(c: &mut Criterion) {
    let mut g = c.benchmark_group("router_pick_replica");
    for balance in [
        Balance::RoundRobin,
        Balance::Weighted,
        Balance::LeastConnections,
        Balance::Random,
        Balance::P2c,
    ] {
        // Backend 0 is the primary, 1 and 2 are replicas; the primary also
        // serves reads, so every pick chooses among three.
        let r = Router::with_policy(0, &[1, 1, 2], &[1, 2], true, balance);
        for (b, latency_us) in [(0, 900), (1, 400), (2, 600)] {
            r.record_latency(b, Duration::from_micros(latency_us));
        }
        let mut seen = [false; 3];
        for _ in 0..200 {
            seen[r.pick(Route::Replica).unwrap()] = true;
        }
        assert!(seen.iter().filter(|&&s| s).count() >= 2, "{balance:?}");
        g.bench_function(format!("{balance:?}"), |b| {
            b.iter(|| r.pick(black_box(Route::Replica)))
        });
    }
    g.finish();
}

// ----------------------------------------------------------------------- Pool

/// An already-open connection with nothing behind it.
struct Conn;

impl Poolable for Conn {
    fn is_usable(&mut self) -> bool {
        true
    }
}

fn bench_pool(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let pool: Pool<Conn> = Pool::new(4, Duration::from_secs(1), Duration::from_secs(60));
    rt.block_on(async {
        let c = pool.get(|| async { Ok::<_, ()>(Conn) }).await.unwrap();
        c.release();
    });
    // Never called: the idle connection is reused every time.
    let no_connect = || async { Err::<Conn, &str>("the pool opened a connection") };

    let mut g = c.benchmark_group("pool");
    g.bench_function("checkout+release/idle_conn", |b| {
        // criterion's async support is not enabled: one block_on per batch.
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let c = pool.get(no_connect).await.unwrap();
                    black_box(&*c);
                    c.release();
                }
                start.elapsed()
            })
        })
    });
    g.finish();
    let s = pool.stats();
    assert_eq!((s.opened, s.closed, s.idle, s.in_use), (1, 0, 1, 0));
}

// No plots: criterion's plotters backend needs a system font, which a bare
// build machine lacks (it panics), and the figures are read as text anyway.
criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = bench_pg_codec, bench_mysql_codec, bench_classifier, bench_router, bench_pool
}
criterion_main!(benches);
