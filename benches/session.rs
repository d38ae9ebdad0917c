//! One unit of work through a whole Fulcrum session, without sockets: the
//! user-space cost of the data path, free of the kernel's noise (issue 28).
//!
//! A client, the session Fulcrum runs for it after login, and a scripted
//! server run as tasks of one single-threaded runtime, joined by in-process
//! pipes (`tokio::io::duplex`, the `Memory` variant of Fulcrum's client and
//! server streams). The session is the daemon's own (`Frontend::run`), with
//! the default settings: transaction pooling, classification, digests,
//! metrics and the read-consistency bookkeeping all on. The server's
//! connection is put into the pool before the run, so no login is timed.
//!
//! Each protocol is measured twice in one run: `through Fulcrum`, and
//! `direct`, the same client on the same scripted server with no session
//! between them. The difference is what Fulcrum adds per unit. PostgreSQL
//! has a third case, `cache hit`: the session of a cluster with a result
//! cache rule on `pgbench_accounts` (`[cluster.cache]`, issue 46), the
//! same Query sent again and again, so every unit after the first is
//! answered from the cache without reaching the server; beside `through
//! Fulcrum` it shows what a hit costs against a forwarded read.
//!
//! - PostgreSQL: pgbench -S's statement as a simple Query, answered with
//!   RowDescription, DataRow, CommandComplete and ReadyForQuery.
//! - MySQL: sysbench oltp_point_select's statement as a COM_QUERY, answered
//!   with a one-column, one-row result set (CLIENT_DEPRECATE_EOF).
//!
//! ```text
//! cargo bench --bench session
//! ```
//!
//! `cargo test --bench session` runs each once, as a smoke test (it fails
//! if a unit does not come back with its row).
//!
//! `FULCRUM_SESSION_UNITS=N FULCRUM_SESSION_TARGET=pg|pg-direct|pg-cache|my|my-direct`
//! runs N units through one target and exits, without criterion: what
//! `tools/instructions-per-unit` counts under callgrind (a figure the
//! machine's load does not move).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use criterion::{criterion_group, Criterion};
use fulcrum_cluster::clients;
use fulcrum_cluster::serve::Frontend;
use fulcrum_mysql::CapabilityFlags as Caps;
use fulcrum_net::Connection;
use fulcrum_tls::{ClientStream, ServerStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::runtime::Runtime;

/// pgbench -S's statement.
const PGBENCH_S: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;";
/// sysbench oltp_point_select's statement.
const POINT_SELECT: &str = "SELECT c FROM sbtest1 WHERE id=4975";
/// Room in each pipe (a unit's bytes are far fewer).
const PIPE: usize = 64 * 1024;
/// The `cache hit` case's cluster key: a rule on the table of [`PGBENCH_S`].
const CACHE_RULE: &str = r#"cache = { mode = "rules", invalidation = "proxy", rule = [{ tables = ["pgbench_accounts"] }] }"#;

/// The cluster, with `extra` keys (e.g. [`CACHE_RULE`]) after its `listen`.
fn config(protocol: &str, extra: &str) -> fulcrum_config::Cluster {
    let text = format!(
        r#"
[[cluster]]
name = "bench"
protocol = "{protocol}"
listen = "127.0.0.1:1"
{extra}

[[cluster.user]]
name = "app"
password = "app"

[[cluster.backend]]
address = "127.0.0.1:2"
role = "primary"
"#
    );
    let config = fulcrum_config::parse(&text, Path::new("session-bench.toml"))
        .expect("the bench's config is valid");
    config.clusters.into_iter().next().expect("one cluster")
}

fn registry_entry(user: &Arc<str>, database: &Arc<str>) -> clients::ClientHandle {
    clients::registry().register(
        "bench",
        user.clone(),
        database.clone(),
        fulcrum_net::ClientPeer::Tcp("127.0.0.1:0".parse().expect("an address")),
    )
}

/// Times `iters` round trips of `unit` on `client`, each read until
/// `done` finds the end of the answer in what arrived.
async fn round_trips(
    client: &mut DuplexStream,
    unit: &[u8],
    iters: u64,
    done: fn(&[u8]) -> bool,
) -> Duration {
    let mut buf = BytesMut::with_capacity(4096);
    let start = Instant::now();
    for _ in 0..iters {
        client.write_all(unit).await.expect("write the unit");
        buf.clear();
        while !done(&buf) {
            let n = client.read_buf(&mut buf).await.expect("read the answer");
            assert!(n > 0, "the answer was cut short: {buf:?}");
        }
    }
    start.elapsed()
}

// ---------------------------------------------------------------- PostgreSQL

mod pg {
    use super::*;
    use fulcrum_postgres::backend::conn::{CancelKey, ServerStatements};
    use fulcrum_postgres::backend::ServerConn;
    use fulcrum_postgres::codec::backend_msg::{command_complete, one_text_row, ready_for_query};
    use fulcrum_postgres::codec::frontend_msg::put_query;
    use fulcrum_postgres::frontend::login::Login;
    use fulcrum_postgres::frontend::ClusterContext;

    /// The server's answer to the statement.
    fn answer() -> BytesMut {
        let mut out = BytesMut::new();
        one_text_row(&mut out, "abalance", "0");
        command_complete(&mut out, "SELECT 1");
        ready_for_query(&mut out, b'I');
        out
    }

    /// Queries the scripted servers have answered, all of them together.
    static QUERIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// A PostgreSQL server that answers every Query with `answer()`.
    pub async fn server(mut io: DuplexStream) {
        let answer = answer();
        let mut buf = BytesMut::with_capacity(4096);
        loop {
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if buf.len() < 1 + len {
                    break;
                }
                let tag = buf[0];
                buf.advance(1 + len);
                match tag {
                    b'Q' => {
                        QUERIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        io.write_all(&answer).await.expect("answer")
                    }
                    b'X' => return,
                    _ => {}
                }
            }
            if io.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    }

    /// A ReadyForQuery ends what arrived.
    pub fn ready(buf: &[u8]) -> bool {
        buf.len() >= 6 && buf[buf.len() - 6] == b'Z'
    }

    pub fn unit() -> BytesMut {
        let mut q = BytesMut::new();
        put_query(&mut q, PGBENCH_S);
        q
    }

    /// A client logged in to a session whose pool holds one connection to
    /// the scripted server.
    pub fn session(rt: &Runtime) -> DuplexStream {
        session_of(rt, "")
    }

    /// [`session`] of a cluster with a cache rule on `pgbench_accounts`,
    /// the cache filled by one unit: every unit from here on is a hit.
    pub fn session_cached(rt: &Runtime) -> DuplexStream {
        let mut client = session_of(rt, CACHE_RULE);
        let queries = || QUERIES.load(std::sync::atomic::Ordering::Relaxed);
        let before = queries();
        within(rt, "the units that fill and hit the cache", async {
            round_trips(&mut client, &unit(), 1, ready).await;
            assert_eq!(queries(), before + 1, "the first unit reached the server");
            round_trips(&mut client, &unit(), 3, ready).await;
        });
        assert_eq!(queries(), before + 1, "the next units were cache hits");
        client
    }

    fn session_of(rt: &Runtime, extra: &str) -> DuplexStream {
        let ctx = ClusterContext::new(config("postgres", extra));
        if !extra.is_empty() {
            // No catalog query reaches the scripted server: the relation
            // catalog is told what a primary would say of the table.
            use fulcrum_cluster::relation_catalog::{Relation, Relations};
            let mut relations = Relations::new();
            let table = Relation {
                keepable: true,
                wide: false,
            };
            relations.add("pgbench_accounts", table);
            ctx.relations.learned("app".into(), relations);
        }
        let (user, database): (Arc<str>, Arc<str>) = ("app".into(), "app".into());
        let (proxy_end, server_end) = tokio::io::duplex(PIPE);
        let mut reported = BTreeMap::new();
        for (k, v) in [
            ("server_version", "15.0"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
        ] {
            reported.insert(k.to_owned(), v.to_owned());
        }
        let conn = ServerConn {
            io: Connection::new(ServerStream::Memory(proxy_end)).with_chunk(16 * 1024),
            cancel: Arc::new(CancelKey {
                address: "127.0.0.1:2".into(),
                process_id: 1,
                secret_key: 1,
                tls: None,
            }),
            reported,
            lexes_apart: false,
            applied: Default::default(),
            prepared: ServerStatements::default(),
            reset_due: false,
        };
        let pool = ctx.pool(0, &user, &database);
        within(rt, "the pool taking the connection", async {
            let held = pool
                .get(|| async { Ok::<_, std::io::Error>(conn) })
                .await
                .expect("the pool takes the connection");
            held.release();
        });
        rt.spawn(server(server_end));
        let (client_end, session_end) = tokio::io::duplex(PIPE);
        let login = Login {
            pool_user: user.clone(),
            user: user.clone(),
            database: database.clone(),
            startup: BTreeMap::new(),
        };
        let entry = registry_entry(&user, &database);
        rt.spawn(async move {
            let client = (ClientStream::Memory(session_end), BytesMut::new());
            let _ = <ClusterContext as Frontend>::run(ctx, client, login, entry).await;
        });
        let mut client = client_end;
        // The welcome: AuthenticationOk ... ReadyForQuery.
        within(rt, "the welcome", async {
            let mut buf = BytesMut::new();
            while !ready(&buf) {
                assert!(client.read_buf(&mut buf).await.expect("welcome") > 0);
            }
        });
        client
    }
}

// --------------------------------------------------------------------- MySQL

mod my {
    use super::*;
    use fulcrum_mysql::backend::ServerConn;
    use fulcrum_mysql::codec::packet::write_packet;
    use fulcrum_mysql::codec::wire::{write_lenenc_int, write_lenenc_str};
    use fulcrum_mysql::frontend::login::Login;
    use fulcrum_mysql::frontend::MyClusterContext;

    /// The flags both sides use: a MariaDB client's and server's usual ones.
    pub fn caps() -> Caps {
        Caps::CLIENT_PROTOCOL_41
            | Caps::CLIENT_SECURE_CONNECTION
            | Caps::CLIENT_PLUGIN_AUTH
            | Caps::CLIENT_TRANSACTIONS
            | Caps::CLIENT_MULTI_RESULTS
            | Caps::CLIENT_PS_MULTI_RESULTS
            | Caps::CLIENT_DEPRECATE_EOF
            | Caps::CLIENT_SESSION_TRACK
            | Caps::CLIENT_LONG_PASSWORD
            | Caps::CLIENT_LONG_FLAG
    }

    /// SERVER_STATUS_AUTOCOMMIT.
    const AUTOCOMMIT: u16 = 0x0002;

    /// The server's answer to the statement: column count, one column
    /// definition, one row, and the OK that ends it (CLIENT_DEPRECATE_EOF).
    fn answer() -> BytesMut {
        let mut out = BytesMut::new();
        write_packet(&mut out, 1, &[1]);
        let mut def = Vec::new();
        for s in ["def", "sbtest", "sbtest1", "sbtest1", "c", "c"] {
            write_lenenc_str(&mut def, s.as_bytes());
        }
        def.push(0x0c);
        def.extend_from_slice(&33u16.to_le_bytes());
        def.extend_from_slice(&480u32.to_le_bytes());
        def.push(0xfe);
        def.extend_from_slice(&1u16.to_le_bytes());
        def.push(0);
        def.extend_from_slice(&[0, 0]);
        write_packet(&mut out, 2, &def);
        let mut row = Vec::new();
        write_lenenc_str(
            &mut row,
            b"68487932199-96439406143-93774651418-41631865787-96406072701",
        );
        write_packet(&mut out, 3, &row);
        let mut ok = vec![0xfe];
        write_lenenc_int(&mut ok, 0);
        write_lenenc_int(&mut ok, 0);
        ok.extend_from_slice(&AUTOCOMMIT.to_le_bytes());
        ok.extend_from_slice(&0u16.to_le_bytes());
        write_packet(&mut out, 4, &ok);
        out
    }

    fn ok_packet(seq: u8) -> BytesMut {
        let mut out = BytesMut::new();
        let mut ok = vec![0];
        write_lenenc_int(&mut ok, 0);
        write_lenenc_int(&mut ok, 0);
        ok.extend_from_slice(&AUTOCOMMIT.to_le_bytes());
        ok.extend_from_slice(&0u16.to_le_bytes());
        write_packet(&mut out, seq, &ok);
        out
    }

    /// A MariaDB server that answers every COM_QUERY with `answer()` and
    /// COM_PING with OK.
    pub async fn server(mut io: DuplexStream) {
        let answer = answer();
        let mut buf = BytesMut::with_capacity(4096);
        loop {
            while buf.len() >= 4 {
                let len = u32::from_le_bytes([buf[0], buf[1], buf[2], 0]) as usize;
                if buf.len() < 4 + len {
                    break;
                }
                let command = buf.get(4).copied();
                buf.advance(4 + len);
                match command {
                    Some(0x03) => io.write_all(&answer).await.expect("answer"),
                    Some(0x0e) => io.write_all(&ok_packet(1)).await.expect("ok"),
                    Some(0x01) => return,
                    _ => {}
                }
            }
            if io.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    }

    /// The result set's closing OK (0xFE, sequence id 4) ends what arrived.
    pub fn done(buf: &[u8]) -> bool {
        // The OK is 4 + 7 bytes: header, then 0xFE, two zero lengths,
        // status and warnings.
        buf.len() >= 11 && buf[buf.len() - 7] == 0xfe && buf[buf.len() - 8] == 4
    }

    /// The login's OK (sequence id 2).
    fn login_ok(buf: &[u8]) -> bool {
        buf.len() >= 5 && buf[3] == 2 && buf[4] == 0
    }

    pub fn unit() -> BytesMut {
        let mut payload = vec![0x03];
        payload.extend_from_slice(POINT_SELECT.as_bytes());
        let mut out = BytesMut::new();
        write_packet(&mut out, 0, &payload);
        out
    }

    pub fn session(rt: &Runtime) -> DuplexStream {
        let ctx = MyClusterContext::new(config("mysql", ""));
        let user: Arc<str> = "app".into();
        let (proxy_end, server_end) = tokio::io::duplex(PIPE);
        let charset = 45;
        let conn = ServerConn {
            io: Connection::new(ServerStream::Memory(proxy_end)).with_chunk(16 * 1024),
            address: "127.0.0.1:2".into(),
            caps: caps(),
            charset,
            connection_id: 1,
            schema: None,
            applied: Vec::new(),
            prepared: Default::default(),
            stmt_clock: 0,
            track_gtid: false,
            connect_query: None,
        };
        let wire = caps() & fulcrum_mysql::codec::capabilities::WIRE_FORMAT;
        let pool = ctx.pool(0, &user, wire, charset);
        within(rt, "the pool taking the connection", async {
            let held = pool
                .get(|| async { Ok::<_, std::io::Error>(conn) })
                .await
                .expect("the pool takes the connection");
            held.release();
        });
        rt.spawn(server(server_end));
        let (client_end, session_end) = tokio::io::duplex(PIPE);
        let login = Login {
            user: user.clone(),
            schema: None,
            caps: caps(),
            charset,
            connection_id: 7,
            next_seq: 2,
            scramble: [7; 20],
        };
        let entry = registry_entry(&user, &"".into());
        rt.spawn(async move {
            let conn = Connection::new(ClientStream::Memory(session_end));
            let _ = <MyClusterContext as Frontend>::run(ctx, conn, login, entry).await;
        });
        let mut client = client_end;
        within(rt, "the login's OK", async {
            let mut buf = BytesMut::new();
            while !login_ok(&buf) {
                assert!(client.read_buf(&mut buf).await.expect("login OK") > 0);
            }
        });
        client
    }
}

/// Every wait here ends: a unit or a setup step that does not come back
/// within this fails the bench instead of hanging it.
const LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` on `rt`, failing with `what` if it takes longer than [`LIMIT`].
fn within<T>(rt: &Runtime, what: &str, f: impl Future<Output = T>) -> T {
    rt.block_on(async {
        tokio::time::timeout(LIMIT, f)
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within {LIMIT:?}"))
    })
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn bench_protocol(
    c: &mut Criterion,
    name: &str,
    unit: BytesMut,
    session: fn(&Runtime) -> DuplexStream,
    cached: Option<fn(&Runtime) -> DuplexStream>,
    server: fn(DuplexStream) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    done: fn(&[u8]) -> bool,
) {
    let mut group = c.benchmark_group(format!("session: {name}"));
    let rt = runtime();
    let mut client = session(&rt);
    group.bench_function("through Fulcrum", |b| {
        b.iter_custom(|iters| {
            within(
                &rt,
                "a unit through Fulcrum",
                round_trips(&mut client, &unit, iters, done),
            )
        })
    });
    if let Some(cached) = cached {
        let mut client = cached(&rt);
        group.bench_function("cache hit", |b| {
            b.iter_custom(|iters| {
                within(
                    &rt,
                    "a cache hit",
                    round_trips(&mut client, &unit, iters, done),
                )
            })
        });
    }
    let (mut direct, server_end) = tokio::io::duplex(PIPE);
    rt.spawn(server(server_end));
    group.bench_function("direct", |b| {
        b.iter_custom(|iters| {
            within(
                &rt,
                "a unit direct",
                round_trips(&mut direct, &unit, iters, done),
            )
        })
    });
    group.finish();
}

fn sessions(c: &mut Criterion) {
    bench_protocol(
        c,
        "pgbench -S, simple Query",
        pg::unit(),
        pg::session,
        Some(pg::session_cached),
        |io| Box::pin(pg::server(io)),
        pg::ready,
    );
    bench_protocol(
        c,
        "sysbench point select, COM_QUERY",
        my::unit(),
        my::session,
        None,
        |io| Box::pin(my::server(io)),
        my::done,
    );
}

/// Where a unit goes: the client's end, the unit's bytes, and the test for
/// the end of its answer.
type Target = (DuplexStream, BytesMut, fn(&[u8]) -> bool);

/// `FULCRUM_SESSION_UNITS`: `n` units through `target`, nothing else.
fn units_only(target: &str, n: u64) {
    let rt = runtime();
    let (mut client, unit, done): Target = match target {
        "pg" => (pg::session(&rt), pg::unit(), pg::ready),
        "pg-cache" => (pg::session_cached(&rt), pg::unit(), pg::ready),
        "my" => (my::session(&rt), my::unit(), my::done),
        "pg-direct" | "my-direct" => {
            let (client, server_end) = tokio::io::duplex(PIPE);
            if target == "pg-direct" {
                rt.spawn(pg::server(server_end));
                (client, pg::unit(), pg::ready)
            } else {
                rt.spawn(my::server(server_end));
                (client, my::unit(), my::done)
            }
        }
        other => panic!(
            "FULCRUM_SESSION_TARGET: pg, pg-direct, pg-cache, my or my-direct, not {other:?}"
        ),
    };
    within(&rt, "the units", round_trips(&mut client, &unit, n, done));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = sessions
}
fn main() {
    if let Ok(n) = std::env::var("FULCRUM_SESSION_UNITS") {
        let n = n.parse().expect("FULCRUM_SESSION_UNITS: a number of units");
        let target = std::env::var("FULCRUM_SESSION_TARGET").unwrap_or_else(|_| "pg".into());
        units_only(&target, n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
