//! LISTEN/NOTIFY through transaction pooling, with the drivers apps use:
//! psycopg 3 (`notifies()`, both builds) and asyncpg (`add_listener`).
//! Fulcrum answers LISTEN itself and listens on the primary for the union
//! of its clients' channels, so listeners cost no server connection: 500
//! of them on a pool of 20 each get every notification, and the pool
//! stays at its size. (The listener that survives a primary kill is in
//! tests/pg_ha.) A listener that never reads holds at most
//! `max_client_notify_bytes` of queued notifications; the rest are dropped
//! and counted.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fulcrum_suite::{
    console_connect, family_sum, pg_connect, pg_two_replicas, start_with_metrics, try_scrape,
    with_console, PgProxyConfig,
};
use fulcrum_testkit::{FulcrumProcess, APP_DB, APP_PASSWORD, APP_USER};

/// Server connections per backend pool.
const POOL: u32 = 20;

/// One Fulcrum for the module: transaction pooling, a pool of 20, md5
/// logins (500 clients log in), metrics on.
fn proxy() -> &'static (FulcrumProcess, PgProxyConfig, u16, u16) {
    static PROXY: OnceLock<(FulcrumProcess, PgProxyConfig, u16, u16)> = OnceLock::new();
    PROXY.get_or_init(|| {
        let c = pg_two_replicas();
        let mut cfg = PgProxyConfig::new(&c.primary().addr())
            .pool_size(POOL)
            .client_auth("md5");
        for r in c.replicas() {
            cfg = cfg.replica(&r.addr());
        }
        let admin = fulcrum_testkit::free_port();
        let (p, metrics) = start_with_metrics(&with_console(&cfg.to_toml(), admin));
        (p, cfg, metrics, admin)
    })
}

fn dsn() -> String {
    let (host, port) = proxy().1.listen.rsplit_once(':').expect("host:port");
    format!("host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10")
}

/// The same, as the URL asyncpg takes.
fn url() -> String {
    let listen = &proxy().1.listen;
    format!("postgresql://{APP_USER}:{APP_PASSWORD}@{listen}/{APP_DB}")
}

/// Runs a Python `script` (psycopg and asyncpg importable; `DSN`, `URL`
/// and `PSYCOPG_IMPL` in its environment) for at most `limit`; its output.
fn python(script: &str, impl_: &str, limit: Duration) -> String {
    let prelude = "import os, psycopg\nDSN = os.environ['DSN']\nURL = os.environ['URL']\nassert psycopg.pq.__impl__ == os.environ['PSYCOPG_IMPL'], psycopg.pq.__impl__\n";
    fulcrum_suite::run_python(
        &format!("the script ({impl_})"),
        &format!("{prelude}{script}"),
        &[("DSN", &dsn()), ("URL", &url()), ("PSYCOPG_IMPL", impl_)],
        limit,
    )
}

/// Samples the primary's pool (server connections, active and idle) and
/// the channels listened to until `stop`; returns their highest values.
fn watch_pool(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(i64, i64)> {
    let (metrics, primary) = (proxy().2, pg_two_replicas().primary().addr());
    std::thread::spawn(move || {
        let (most, channels) = (AtomicI64::new(0), AtomicI64::new(0));
        while !stop.load(Ordering::Relaxed) {
            if let Some(text) = try_scrape(metrics) {
                let pool = family_sum(
                    &text,
                    "fulcrum_server_connections",
                    &[("backend", &primary)],
                );
                most.fetch_max(pool as i64, Ordering::Relaxed);
                let listened = family_sum(&text, "fulcrum_listen_channels", &[]);
                channels.fetch_max(listened as i64, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (most.into_inner(), channels.into_inner())
    })
}

#[test]
fn five_hundred_listeners_on_a_pool_of_twenty_get_every_notification() {
    // 250 psycopg and 250 asyncpg clients listen on one channel; a writer
    // sends 20 notifications through Fulcrum (NOTIFY and pg_notify, in and
    // out of transactions). Every listener counts 20, in order.
    let script = r#"
import asyncio, asyncpg
N, SYNC, ASYNC = 20, 250, 250
listeners = [psycopg.connect(DSN, autocommit=True) for _ in range(SYNC)]
for c in listeners:
    c.execute("LISTEN many_ch")
got = {}

async def main():
    conns = [await asyncpg.connect(URL) for _ in range(ASYNC)]
    for i, c in enumerate(conns):
        got[i] = []
        await c.add_listener("many_ch", lambda _c, _pid, _ch, payload, i=i: got[i].append(payload))
    with psycopg.connect(DSN, autocommit=True) as w:
        for k in range(N):
            if k % 3 == 0:
                w.execute("SELECT pg_notify('many_ch', %s)", (str(k),))
            elif k % 3 == 1:
                with w.transaction():
                    w.execute(f"NOTIFY many_ch, '{k}'")
            else:
                w.execute(f"NOTIFY many_ch, '{k}'")
    for _ in range(300):
        if all(len(v) == N for v in got.values()):
            break
        await asyncio.sleep(0.1)
    for c in conns:
        await c.close()

asyncio.run(main())
want = [str(k) for k in range(N)]
async_ok = sum(1 for v in got.values() if v == want)
sync_ok = 0
for c in listeners:
    seen = [n.payload for n in c.notifies(timeout=10, stop_after=N)]
    sync_ok += seen == want
    c.close()
print(sync_ok, async_ok)
"#;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_pool(stop.clone());
    let out = python(script, "binary", Duration::from_secs(240));
    stop.store(true, Ordering::Relaxed);
    let (most, channels) = watcher.join().unwrap();
    eprintln!("500 listeners: {out:?}; primary pool at most {most}; channels {channels}");
    assert_eq!(
        out.trim(),
        "250 250",
        "listeners with all 20 notifications in order (psycopg, asyncpg)"
    );
    assert!(most <= POOL as i64, "the pool grew to {most} (size {POOL})");
    assert!(channels >= 1, "the channel was listened to on the primary");
}

#[test]
fn psycopg_notifies_and_asyncpg_add_listener_work_through_transaction_pooling() {
    // psycopg: LISTEN in autocommit and inside a transaction (effective at
    // COMMIT), quoted and folded names, the notifying backend's pid, a
    // notification arriving while the listener is busy (delivered after its
    // answer), UNLISTEN and UNLISTEN *.
    let script = r#"
import threading, time
with psycopg.connect(DSN, autocommit=True) as conn, psycopg.connect(DSN, autocommit=True) as other:
    conn.execute("LISTEN Plain_Ch")
    conn.execute('LISTEN "Quoted Ch"')
    with other.transaction():
        pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
        other.execute("NOTIFY plain_ch, 'one'")
    other.execute("""NOTIFY "Quoted Ch", 'two'""")
    seen = [(n.channel, n.payload, n.pid == pid) for n in conn.notifies(timeout=5, stop_after=2)]
    print(seen)
    # Busy: the notification waits for the answer, then comes.
    t = threading.Timer(0.3, lambda: other.execute("NOTIFY plain_ch, 'late'"))
    t.start()
    print(conn.execute("SELECT 7 FROM pg_sleep(1)").fetchone()[0])
    t.join()
    print([n.payload for n in conn.notifies(timeout=5, stop_after=1)])
    conn.execute("UNLISTEN plain_ch")
    other.execute("NOTIFY plain_ch, 'gone'")
    other.execute("""NOTIFY "Quoted Ch", 'kept'""")
    print([n.payload for n in conn.notifies(timeout=2)])
    conn.execute("UNLISTEN *")
    other.execute("""NOTIFY "Quoted Ch", 'none'""")
    print([n.payload for n in conn.notifies(timeout=1)])
with psycopg.connect(DSN) as conn, psycopg.connect(DSN, autocommit=True) as other:
    conn.execute("LISTEN tx_ch")
    conn.commit()
    other.execute("NOTIFY tx_ch, 'after commit'")
    print([n.payload for n in conn.notifies(timeout=5, stop_after=1)])
"#;
    let want = "[('plain_ch', 'one', True), ('Quoted Ch', 'two', True)]\n7\n['late']\n['kept']\n[]\n['after commit']\n";
    for impl_ in ["python", "binary"] {
        assert_eq!(
            python(script, impl_, Duration::from_secs(60)),
            want,
            "{impl_}"
        );
    }
    // asyncpg: add_listener and remove_listener (LISTEN and UNLISTEN sent
    // as simple queries), the payload and pid it hands the callback.
    let script = r#"
import asyncio, asyncpg
async def main():
    a = await asyncpg.connect(URL)
    b = await asyncpg.connect(URL)
    got = asyncio.Queue()
    cb = lambda _c, pid, ch, payload: got.put_nowait((ch, payload, pid))
    await a.add_listener("apg_ch", cb)
    async with b.transaction():
        pid = await b.fetchval("SELECT pg_backend_pid()")
        await b.execute("NOTIFY apg_ch, 'hello'")
    ch, payload, from_pid = await asyncio.wait_for(got.get(), 5)
    print(ch, payload, from_pid == pid)
    await a.remove_listener("apg_ch", cb)
    await b.execute("NOTIFY apg_ch, 'unheard'")
    await asyncio.sleep(1)
    print(got.qsize())
    await a.close(); await b.close()
asyncio.run(main())
"#;
    assert_eq!(
        python(script, "binary", Duration::from_secs(60)),
        "apg_ch hello True\n0\n"
    );
}

#[tokio::test]
async fn show_listeners_lists_the_listening_connection() {
    // A client listening to two channels: the console shows the listening
    // connection of its database and user, on the primary, and the client
    // leaving takes its subscriptions away.
    let (_, cfg, _, admin) = proxy();
    // Several statements in one query: run on a server the client is
    // pinned to, as before (it works; Fulcrum's listener is not involved).
    let pinned = pg_connect(cfg).await;
    pinned
        .batch_execute("LISTEN pinned_a; LISTEN pinned_b")
        .await
        .unwrap();
    drop(pinned);
    let client = pg_connect(cfg).await;
    client.batch_execute("LISTEN console_a").await.unwrap();
    client.batch_execute("LISTEN console_b").await.unwrap();
    let console = console_connect(*admin).await;
    let rows = console.simple_query("SHOW LISTENERS").await.unwrap();
    let row = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r)
                if r.get("database") == Some(APP_DB) && r.get("user") == Some(APP_USER) =>
            {
                Some((
                    r.get("channels").unwrap().parse::<usize>().unwrap(),
                    r.get("clients").unwrap().parse::<usize>().unwrap(),
                    r.get("backend").unwrap().to_owned(),
                ))
            }
            _ => None,
        })
        .expect("a row for app on its database");
    assert!(row.0 >= 2 && row.1 >= 1, "{row:?}");
    assert_eq!(row.2, pg_two_replicas().primary().addr(), "on the primary");
}

/// A client that LISTENs and then never reads its socket: once the socket
/// buffers are full, its queue fills to `max_client_notify_bytes` (64 kB
/// here; `notify_queue`'s count, 10000, is never reached) and the rest of
/// 4000 notifications of 7900 bytes (31 MB) are dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_never_reads_holds_at_most_max_client_notify_bytes() {
    let c = pg_two_replicas();
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .pool_size(4)
        .extra("max_client_notify_bytes = \"64kB\"");
    let (_p, metrics) = start_with_metrics(&cfg.to_toml());
    let config: tokio_postgres::Config = cfg
        .conn_string(APP_USER, APP_DB)
        .parse()
        .expect("a valid connection string");
    let (listener, mut connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    // The connection is driven until LISTEN is answered, then never again:
    // its socket stays open and unread.
    {
        let listen = listener.batch_execute("LISTEN notify_bytes");
        tokio::select! {
            r = listen => r.unwrap(),
            r = &mut connection => panic!("the connection ended: {r:?}"),
        }
    }
    let dropped_before = tokio::task::block_in_place(|| {
        family_sum(
            &try_scrape(metrics).unwrap_or_default(),
            "fulcrum_notifications_total",
            &[("outcome", "dropped")],
        )
    });
    // Distinct payloads: PostgreSQL folds identical ones sent in one
    // transaction into one.
    let sender = pg_connect(&cfg).await;
    sender
        .batch_execute(
            "SELECT pg_notify('notify_bytes', i || repeat('x', 7900)) FROM generate_series(1, 4000) i",
        )
        .await
        .unwrap();
    // Drops are counted as the listening connection reads them.
    let mut dropped = 0.0;
    for _ in 0..100 {
        let text = tokio::task::block_in_place(|| try_scrape(metrics).unwrap_or_default());
        dropped = family_sum(
            &text,
            "fulcrum_notifications_total",
            &[("outcome", "dropped")],
        ) - dropped_before;
        if dropped > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = tokio::task::block_in_place(|| try_scrape(metrics).unwrap_or_default());
    let notes: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("notif") || l.contains("listen"))
        .collect();
    assert!(
        dropped > 0.0,
        "notifications past max_client_notify_bytes are dropped and counted:\n{}",
        notes.join("\n")
    );
    drop(connection);
}
