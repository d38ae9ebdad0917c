//! SHOW SERVERS, SHOW QUERIES and SHOW POOLS while clients work: each
//! server connection listed, statement digests, waiting clients and their wait.

use std::time::Duration;

use fulcrum_suite::{pg_connect, try_console_connect, PgProxyConfig, CONSOLE_PASSWORD};
use fulcrum_testkit::{free_port, FulcrumProcess, APP_DB, APP_USER};
use tokio_postgres::SimpleQueryMessage;

use super::helpers::{console_toml, setup, show};

/// SHOW SERVERS in PgBouncer's shape: the connection a session-pooled
/// client holds, with its user, database, address and the server's own
/// process id, `active` while the client is in a transaction, linked to
/// the client (SHOW CLIENTS' id) and showing the `application_name` the
/// client set; `idle` and unlinked after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_servers_lists_each_server_connection() {
    let c = fulcrum_suite::pg_primary();
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .pool_mode("session");
    let _p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    let a = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let client = pg_connect(&cfg).await;
    client.batch_execute("BEGIN").await.unwrap();
    let pid: String = match &client
        .simple_query("SELECT pg_backend_pid()")
        .await
        .unwrap()[..]
    {
        [SimpleQueryMessage::RowDescription(_), SimpleQueryMessage::Row(r), ..]
        | [SimpleQueryMessage::Row(r), ..] => r.get(0).unwrap().to_owned(),
        other => panic!("{other:?}"),
    };
    // The client's SET is followed (the server reports it).
    client
        .batch_execute("SET application_name = 'follows-set'")
        .await
        .unwrap();
    let (ccols, clients) = show(&a, "SHOW CLIENTS").await;
    let ccol = |name: &str| ccols.iter().position(|c| c == name).unwrap();
    let active: Vec<&Vec<String>> = clients
        .iter()
        .filter(|r| r[ccol("state")] == "active")
        .collect();
    assert_eq!(active.len(), 1, "{clients:?}");
    let client_id = active[0][ccol("id")].clone();
    let (columns, rows) = show(&a, "SHOW SERVERS").await;
    let col = |name: &str| columns.iter().position(|c| c == name).unwrap();
    let mine: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| r[col("remote_pid")] == pid)
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "one row with the server's pid {pid}: {rows:?}"
    );
    let r = mine[0];
    assert_eq!(r[col("type")], "S");
    assert_eq!(r[col("user")], APP_USER);
    assert_eq!(r[col("database")], APP_DB);
    assert_eq!(r[col("state")], "active", "{r:?}");
    assert_eq!(
        format!("{}:{}", r[col("addr")], r[col("port")]),
        c.primary().addr()
    );
    assert_eq!(r[col("role")], "primary");
    assert!(r[col("local_port")].parse::<u16>().unwrap() > 0, "{r:?}");
    assert_eq!(r[col("link")], client_id, "the client it serves: {r:?}");
    assert_eq!(r[col("application_name")], "follows-set", "{r:?}");
    client.batch_execute("COMMIT").await.unwrap();
    drop(client);
    // Back in the pool: idle.
    let mut state = String::new();
    for _ in 0..50 {
        let (_, rows) = show(&a, "SHOW SERVERS").await;
        if let Some(r) = rows.iter().find(|r| r[col("remote_pid")] == pid) {
            state = r[col("state")].clone();
            if state == "idle" {
                assert_eq!(r[col("link")], "", "an idle server serves no one: {r:?}");
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "idle");
}

/// SHOW QUERIES: simple and extended-protocol executions of one statement
/// with different literals are one digest, with their rows, errors, time and
/// where they ran; SHOW QUERIES RESET empties it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_queries_lists_statement_digests() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let c = pg_connect(&s.cfg).await;
    c.batch_execute("CREATE TABLE IF NOT EXISTS digest_t (id int, v text)")
        .await
        .unwrap();
    for i in 0..5 {
        c.simple_query(&format!("INSERT INTO digest_t VALUES ({i}, 'x{i}')"))
            .await
            .unwrap();
    }
    // Read-your-writes may keep the reads on the primary: wait for the replica.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        c.simple_query(&format!("SELECT * FROM digest_t WHERE id >= {i}"))
            .await
            .unwrap();
    }
    let stmt = c
        .prepare("SELECT * FROM digest_t WHERE id >= $1")
        .await
        .unwrap();
    for i in 0..4i32 {
        c.query(&stmt, &[&i]).await.unwrap();
    }
    let err = c
        .simple_query("SELECT nope FROM digest_t")
        .await
        .unwrap_err();
    // The server's own error (a column or, on a lagging replica, the table
    // unknown), so the statement reached a server and has its digest.
    let code = err.code().map(|c| c.code().to_owned());
    assert!(
        matches!(code.as_deref(), Some("42703") | Some("42P01")),
        "the server's error: {err:?}"
    );
    // tokio-postgres returns the error as soon as the ErrorResponse comes,
    // which PostgreSQL flushes before its ReadyForQuery; the unit (and its
    // digest) ends with that. The next statement waits for it.
    c.batch_execute("").await.unwrap();
    let (columns, rows) = show(&a, "SHOW QUERIES").await;
    assert_eq!(
        columns,
        [
            "cluster",
            "digest",
            "query",
            "calls",
            "errors",
            "rows",
            "total_us",
            "avg_us",
            "p50_us",
            "p99_us",
            "max_us",
            "primary",
            "replica",
            "first_seen_s",
            "last_seen_s"
        ]
    );
    let find = |text: &str| {
        rows.iter()
            .find(|r| r[2] == text)
            .unwrap_or_else(|| panic!("{text:?} not in {rows:#?}"))
            .clone()
    };
    let n = |r: &Vec<String>, i: usize| r[i].parse::<u64>().unwrap();
    let insert = find("insert into digest_t values (?, ?)");
    assert_eq!((n(&insert, 3), n(&insert, 4), n(&insert, 5)), (5, 0, 5));
    assert_eq!(
        (n(&insert, 11), n(&insert, 12)),
        (5, 0),
        "writes on the primary"
    );
    let select = find("select * from digest_t where id >= ?");
    assert_eq!(
        n(&select, 3),
        3,
        "the simple-protocol executions: {select:?}"
    );
    assert_eq!(n(&select, 5), 5 + 4 + 3, "rows returned");
    let prepared = find("select * from digest_t where id >= $1");
    assert_eq!(n(&prepared, 3), 4, "the extended-protocol executions");
    assert_eq!(n(&prepared, 5), 5 + 4 + 3 + 2);
    for r in [&insert, &select, &prepared] {
        assert!(n(r, 6) > 0 && n(r, 7) > 0, "time measured: {r:?}");
        assert!(
            n(r, 8) <= n(r, 9) && n(r, 9) <= n(r, 10) * 2,
            "p50 <= p99 ~ max: {r:?}"
        );
        assert_eq!(r[0], "main");
    }
    assert_eq!(n(&select, 11) + n(&select, 12), 3);
    let bad = find("select nope from digest_t");
    assert_eq!((n(&bad, 3), n(&bad, 4)), (1, 1), "the error is counted");
    // Ordered by total time.
    let totals: Vec<u64> = rows.iter().map(|r| n(r, 6)).collect();
    assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{totals:?}");
    let (_, _) = show(&a, "SHOW QUERIES RESET").await;
    let (_, after) = show(&a, "SHOW QUERIES main").await;
    assert!(after.is_empty(), "{after:?}");
    let err = a.simple_query("SHOW QUERIES nosuch").await.unwrap_err();
    let db = err.as_db_error().expect("an ErrorResponse");
    assert!(db.message().contains("no cluster named"), "{db:?}");
    assert_eq!(db.code().code(), "42704");
    // The console goes on.
    let (_, again) = show(&a, "SHOW QUERIES").await;
    assert!(again.is_empty(), "{again:?}");
}

/// SHOW POOLS while a client waits for the pool's one connection:
/// `cl_waiting` counts it and `maxwait`/`maxwait_us` how long it has
/// waited, as PgBouncer's do; both go back to 0 once it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_pools_counts_a_waiting_client_and_its_wait() {
    let c = fulcrum_suite::pg_primary();
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .pool_size(1)
        .extra("pool_timeout = \"20s\"");
    let _p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    let a = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let holder = pg_connect(&cfg).await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let waiter = pg_connect(&cfg).await;
    let waiting = tokio::spawn(async move { waiter.simple_query("SELECT 2").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mine = |(columns, rows): (Vec<String>, Vec<Vec<String>>)| {
        let col = |name: &str| columns.iter().position(|c| c == name).unwrap();
        let r = rows
            .iter()
            .find(|r| r[col("database")] == APP_DB && r[col("user")] == APP_USER)
            .unwrap_or_else(|| panic!("a pool row for {APP_DB}/{APP_USER}: {rows:?}"))
            .clone();
        let n = |name: &str| r[col(name)].parse::<u64>().unwrap();
        (
            n("cl_active"),
            n("cl_waiting"),
            n("sv_active"),
            n("maxwait") * 1_000_000 + n("maxwait_us"),
        )
    };
    let (active, waiting_now, sv_active, maxwait_us) = mine(show(&a, "SHOW POOLS").await);
    assert_eq!(
        (active, waiting_now, sv_active),
        (1, 1, 1),
        "one holds, one waits"
    );
    assert!(
        (400_000..20_000_000).contains(&maxwait_us),
        "the waiter has waited about 600 ms: {maxwait_us} µs"
    );
    holder.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served once the connection is free")
        .unwrap()
        .unwrap();
    let (_, waiting_now, _, maxwait_us) = mine(show(&a, "SHOW POOLS").await);
    assert_eq!((waiting_now, maxwait_us), (0, 0), "nobody waits any more");
}
