//! The admin console's SHOW commands: every one has its columns, and
//! unknown databases leave no pools behind.

use std::collections::HashSet;
use std::time::Duration;

use fulcrum_suite::{pg_connect, try_console_connect, CONSOLE_PASSWORD};
use fulcrum_testkit::{APP_DB, APP_USER};
use tokio_postgres::NoTls;

use super::helpers::{setup, show};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_show_command_has_its_columns() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let _client = pg_connect(&s.cfg).await;
    let expect: &[(&str, &[&str])] = &[
        ("SHOW VERSION", &["version"]),
        (
            "SHOW CLUSTERS",
            &[
                "cluster",
                "protocol",
                "backend",
                "role",
                "state",
                "lag_bytes",
                "lag_seconds",
                "weight",
                "disabled",
                "paused",
                "failover_blocked",
                "topology",
                "epoch",
                "leader",
                "leads",
                "coordinator_heard_seconds_ago",
            ],
        ),
        (
            "SHOW POOLS",
            &[
                "database",
                "user",
                "cl_active",
                "cl_waiting",
                "cl_active_cancel_req",
                "cl_waiting_cancel_req",
                "sv_active",
                "sv_active_cancel",
                "sv_being_canceled",
                "sv_idle",
                "sv_used",
                "sv_tested",
                "sv_login",
                "maxwait",
                "maxwait_us",
                "pool_mode",
                "cluster",
                "backends",
                "pool_size",
                "min_pool_size",
                "reserve_pool_size",
                "sv_reserve",
                "sv_opened",
                "sv_closed",
                "waits",
            ],
        ),
        (
            "SHOW SERVER_POOLS",
            &[
                "cluster",
                "database",
                "user",
                "backend",
                "sv_active",
                "sv_idle",
                "sv_opened",
                "sv_closed",
                "waits",
                "pool_mode",
                "pool_size",
                "min_pool_size",
                "reserve_pool_size",
                "sv_reserve",
                "db_connections",
                "max_db_connections",
                "user_connections",
                "max_user_connections",
            ],
        ),
        ("SHOW HELP", &["command", "does"]),
        (
            "SHOW SERVERS",
            &[
                "type",
                "user",
                "database",
                "state",
                "addr",
                "port",
                "local_addr",
                "local_port",
                "connect_time",
                "request_time",
                "wait",
                "wait_us",
                "close_needed",
                "ptr",
                "link",
                "remote_pid",
                "tls",
                "application_name",
                "cluster",
                "backend",
                "role",
            ],
        ),
        (
            "SHOW BACKENDS",
            &[
                "cluster",
                "backend",
                "role",
                "state",
                "probe",
                "sv_active",
                "sv_idle",
                "last_error",
                "reason",
            ],
        ),
        (
            "SHOW CLIENTS",
            &[
                "type",
                "user",
                "database",
                "state",
                "addr",
                "port",
                "connect_time",
                "request_time",
                "wait",
                "wait_us",
                "cluster",
                "server",
                "id",
                "remote_pid",
                "uid",
            ],
        ),
        (
            "SHOW STATS",
            &[
                "database",
                "total_xact_count",
                "total_query_count",
                "total_received",
                "total_sent",
                "total_xact_time",
                "total_query_time",
                "total_wait_time",
                "avg_xact_count",
                "avg_query_count",
                "avg_recv",
                "avg_sent",
                "avg_xact_time",
                "avg_query_time",
                "avg_wait_time",
                "total_requests",
            ],
        ),
        (
            "SHOW TOTALS",
            &[
                "database",
                "total_xact_count",
                "total_query_count",
                "total_received",
                "total_sent",
                "total_xact_time",
                "total_query_time",
                "total_wait_time",
                "avg_xact_count",
                "avg_query_count",
                "avg_recv",
                "avg_sent",
                "avg_xact_time",
                "avg_query_time",
                "avg_wait_time",
                "total_requests",
            ],
        ),
        ("SHOW CONFIG", &["key", "value"]),
        ("SHOW MEM", &["name", "cluster", "items", "bytes"]),
        ("SHOW LISTS", &["list", "items"]),
        (
            "SHOW DATABASES",
            &[
                "cluster",
                "database",
                "backends",
                "pools",
                "pool_size",
                "pool_mode",
                "sv_active",
                "sv_idle",
                "name",
                "min_pool_size",
                "reserve_pool",
                "max_connections",
                "current_connections",
                "paused",
                "disabled",
            ],
        ),
        (
            "SHOW USERS",
            &["cluster", "name", "server_user", "source", "pool_mode"],
        ),
    ];
    for (cmd, cols) in expect {
        let (columns, rows) = show(&a, cmd).await;
        assert_eq!(
            columns,
            cols.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "{cmd}"
        );
        assert!(!rows.is_empty(), "{cmd} has rows");
    }
    // Tables that are empty here (no listener, no mirror): their columns.
    let empty: &[(&str, &[&str])] = &[
        (
            "SHOW MIRROR",
            &[
                "cluster",
                "target",
                "digest",
                "query",
                "sent",
                "dropped",
                "differing",
                "primary_p50_ms",
                "primary_p99_ms",
                "mirror_p50_ms",
                "mirror_p99_ms",
            ],
        ),
        (
            "SHOW LISTENERS",
            &[
                "cluster",
                "database",
                "user",
                "channels",
                "clients",
                "subscriptions",
                "backend",
                "reconnects",
            ],
        ),
    ];
    for (cmd, cols) in empty {
        let (columns, _) = show(&a, cmd).await;
        assert_eq!(
            columns,
            cols.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "{cmd}"
        );
    }
    let (_, clusters) = show(&a, "SHOW CLUSTERS").await;
    let roles: HashSet<(String, String)> = clusters
        .iter()
        .map(|r| (r[2].clone(), r[3].clone()))
        .collect();
    assert!(
        roles.contains(&(s.replica_addr.clone(), "replica".into())),
        "{clusters:?}"
    );
    assert!(
        clusters.iter().any(|r| r[3] == "primary" && r[4] == "up"),
        "{clusters:?}"
    );
    let (_, clients) = show(&a, "SHOW CLIENTS").await;
    assert_eq!(clients.len(), 1, "one app client connected: {clients:?}");
    assert_eq!(
        (
            &clients[0][1][..],
            &clients[0][3][..],
            &clients[0][4][..],
            &clients[0][10][..]
        ),
        (APP_USER, "idle", "127.0.0.1", "main"),
        "{clients:?}"
    );
    // A client running a query is active, on the server it runs on.
    let sleeper = pg_connect(&s.cfg).await;
    let running = tokio::spawn(async move { sleeper.simple_query("SELECT pg_sleep(1)").await });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, clients) = show(&a, "SHOW CLIENTS").await;
        if let Some(active) = clients.iter().find(|r| r[3] == "active") {
            assert_eq!(active[11], s.replica_addr, "the read runs on the replica");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{clients:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.await.unwrap().unwrap();
    let n = |r: &Vec<String>, i: usize| r[i].parse::<u64>().unwrap_or_else(|_| panic!("{r:?}"));
    // The unit's time is counted as its session finishes it, which may be
    // just after the client has its answer: looked at again for a while.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let totals = loop {
        let (_, totals) = show(&a, "SHOW TOTALS").await;
        assert_eq!(totals.len(), 1, "{totals:?}");
        assert_eq!(totals[0][0], "total");
        if (n(&totals[0], 5) > 0 && n(&totals[0], 13) > 0) || std::time::Instant::now() > deadline {
            break totals;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(n(&totals[0], 1) > 0, "transactions counted: {totals:?}");
    assert!(
        n(&totals[0], 5) > 0 && n(&totals[0], 13) > 0,
        "time columns filled: {totals:?}"
    );
    let (_, databases) = show(&a, "SHOW DATABASES").await;
    assert!(
        databases.iter().any(|r| r[1] == APP_DB && r[3] != "0"),
        "the app database and its pools: {databases:?}"
    );
    let (_, users) = show(&a, "SHOW USERS").await;
    assert!(
        users
            .iter()
            .any(|r| r[1] == APP_USER && r[2] == APP_USER && r[3] == "config"),
        "{users:?}"
    );
    let (_, config) = show(&a, "SHOW CONFIG").await;
    assert!(
        !config.iter().any(|r| r[1].contains("secret")),
        "no password in SHOW CONFIG"
    );
    assert!(
        config
            .iter()
            .any(|r| r[0] == "fulcrum.admin_auth" && r[1] == "scram-sha-256"),
        "{config:?}"
    );
    assert!(
        config
            .iter()
            .any(|r| r[0] == "cluster.main.client_auth" && r[1] == "md5"),
        "the cluster's client_auth: {config:?}"
    );
    assert!(
        !config.iter().any(|r| r[0].ends_with(".auth_hba_file")),
        "no hba file without client_auth = \"hba\": {config:?}"
    );
}

/// Logins to databases that do not exist get the server's 3D000 and leave
/// no pool behind (a client could otherwise grow the pool map one made-up
/// name at a time); the real database's pool stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_databases_leave_no_pools() {
    let s = tokio::task::block_in_place(setup);
    let app = tokio_postgres::connect(&s.cfg.conn_string(APP_USER, APP_DB), NoTls)
        .await
        .expect("login to the real database");
    tokio::spawn(app.1);
    app.0.simple_query("SELECT 1").await.unwrap();
    for i in 0..50 {
        let db = format!("made_up_{i}");
        let e = tokio_postgres::connect(&s.cfg.conn_string(APP_USER, &db), NoTls)
            .await
            .err()
            .unwrap_or_else(|| panic!("login to {db} succeeded"));
        let code = e.as_db_error().map(|d| d.code().code().to_owned());
        assert_eq!(code.as_deref(), Some("3D000"), "{e:?}");
    }
    let console = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let (columns, rows) = show(&console, "SHOW POOLS").await;
    let db = columns.iter().position(|c| c == "database").unwrap();
    let databases: HashSet<&str> = rows.iter().map(|r| r[db].as_str()).collect();
    assert!(databases.contains(APP_DB), "{rows:?}");
    assert!(
        !databases.iter().any(|d| d.starts_with("made_up_")),
        "pools left for unknown databases: {databases:?}"
    );
}
