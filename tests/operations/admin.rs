//! The admin console through tokio-postgres (psql speaks the same protocol):
//! every SHOW command's shape, DISABLE draining a backend from reads and
//! ENABLE bringing it back, PAUSE holding new queries until RESUME, SET log,
//! clear errors (never a dropped connection) for bad commands, and logins
//! by SCRAM-SHA-256 (default) or md5 (`admin_auth`).

use std::collections::HashSet;
use std::time::Duration;

use fulcrum_suite::{
    pg_connect, startup_message, try_console_connect, with_console, PgProxyConfig,
    CONSOLE_PASSWORD, CONSOLE_USER, PROTOCOL_3_0,
};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, APP_DB, APP_USER};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

struct Setup {
    cluster: PgCluster,
    _fulcrum: FulcrumProcess,
    cfg: PgProxyConfig,
    admin_port: u16,
    primary: u16,
    replica: u16,
    replica_addr: String,
}

fn setup() -> Setup {
    let c = PgCluster::builder().replicas(1).start().expect("cluster");
    let admin_port = free_port();
    // Promotion (SWITCHOVER) needs a superuser for the health loop.
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .replica(&c.replicas()[0].addr())
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"");
    let p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    Setup {
        primary: c.primary().port(),
        replica: c.replicas()[0].port(),
        replica_addr: c.replicas()[0].addr(),
        cluster: c,
        _fulcrum: p,
        cfg,
        admin_port,
    }
}

/// `cfg`'s daemon with the console on `admin_port`, the `ops` login, and
/// `global` (more `[fulcrum]` keys).
fn console_toml(cfg: &PgProxyConfig, admin_port: u16, global: &str) -> String {
    let toml = cfg
        .to_toml()
        .replacen("[fulcrum]\n", &format!("[fulcrum]\n{global}"), 1);
    with_console(&toml, admin_port)
}

/// The console's first answer to a startup packet for `user`: the
/// authentication request code (10 SASL, 5 md5) and the rest of its body
/// (the SASL mechanisms, or the md5 salt).
async fn auth_request(port: u16, user: &str) -> (i32, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let msg = startup_message(PROTOCOL_3_0, &[("user", user), ("database", "fulcrum")]);
    stream.write_all(&msg).await.unwrap();
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).await.unwrap();
    assert_eq!(header[0], b'R', "an authentication request");
    let len = i32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; len - 4];
    stream.read_exact(&mut rest).await.unwrap();
    let code = i32::from_be_bytes(rest[..4].try_into().unwrap());
    (code, rest[4..].to_vec())
}

/// (columns, rows) of a SHOW.
async fn show(client: &Client, what: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let msgs = client
        .simple_query(what)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let mut columns = Vec::new();
    let mut rows = Vec::new();
    for m in msgs {
        match m {
            SimpleQueryMessage::RowDescription(cols) => {
                columns = cols.iter().map(|c| c.name().to_owned()).collect()
            }
            SimpleQueryMessage::Row(r) => {
                if columns.is_empty() {
                    columns = r.columns().iter().map(|c| c.name().to_owned()).collect();
                }
                rows.push(
                    (0..r.len())
                        .map(|i| r.get(i).unwrap_or("").to_owned())
                        .collect(),
                )
            }
            _ => {}
        }
    }
    (columns, rows)
}

async fn port_of(c: &Client) -> u16 {
    let msgs = c.simple_query("SELECT inet_server_port()").await.unwrap();
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .unwrap()
}

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
    let (_, totals) = show(&a, "SHOW TOTALS").await;
    assert_eq!(totals.len(), 1, "{totals:?}");
    assert_eq!(totals[0][0], "total");
    let n = |r: &Vec<String>, i: usize| r[i].parse::<u64>().unwrap_or_else(|_| panic!("{r:?}"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_drains_a_backend_and_enable_brings_it_back() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let c = pg_connect(&s.cfg).await;
    assert_eq!(port_of(&c).await, s.replica);
    a.simple_query(&format!("DISABLE {}", s.replica_addr))
        .await
        .unwrap();
    for _ in 0..5 {
        assert_eq!(
            port_of(&c).await,
            s.primary,
            "reads leave the disabled replica"
        );
    }
    let (_, clusters) = show(&a, "SHOW CLUSTERS").await;
    assert!(clusters
        .iter()
        .any(|r| r[2] == s.replica_addr && r[8] == "true"));
    let reason_of = |rows: &Vec<Vec<String>>| {
        rows.iter()
            .find(|r| r[1] == s.replica_addr)
            .map(|r| r[8].clone())
            .unwrap()
    };
    let (_, backends) = show(&a, "SHOW BACKENDS").await;
    assert!(
        reason_of(&backends).starts_with("disabled by an operator"),
        "SHOW BACKENDS says why: {backends:?}"
    );
    a.simple_query(&format!("ENABLE {}", s.replica_addr))
        .await
        .unwrap();
    assert_eq!(port_of(&c).await, s.replica);
    let (_, backends) = show(&a, "SHOW BACKENDS").await;
    assert_eq!(reason_of(&backends), "", "in service again");
    // The primary cannot be drained.
    let primary_addr = format!("127.0.0.1:{}", s.primary);
    let e = a
        .simple_query(&format!("DISABLE {primary_addr}"))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("primary"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_new_queries_until_resume() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let c = pg_connect(&s.cfg).await;
    c.simple_query("SELECT 1").await.unwrap();
    a.simple_query("PAUSE").await.unwrap();
    let held = tokio::spawn(async move {
        let started = std::time::Instant::now();
        c.simple_query("SELECT 1").await.unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!held.is_finished(), "the query waits while paused");
    a.simple_query("RESUME").await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
}

/// PgBouncer's `PAUSE db`: the database's new queries wait until `RESUME
/// db`, while another database of the same cluster goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_a_database_holds_its_queries_until_resume() {
    const OTHER_DB: &str = "pause_other";
    let c = fulcrum_suite::pg_primary();
    let _ = c
        .primary()
        .sql(&format!("CREATE DATABASE {OTHER_DB} OWNER {APP_USER}"));
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let _p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    let a = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let client = pg_connect(&cfg).await;
    client.simple_query("SELECT 1").await.unwrap();
    let (other, conn) = tokio_postgres::connect(&cfg.conn_string(APP_USER, OTHER_DB), NoTls)
        .await
        .expect("login to the other database");
    tokio::spawn(conn);
    other.simple_query("SELECT 1").await.unwrap();
    let e = a.simple_query("PAUSE no_such_db").await.unwrap_err();
    assert!(format!("{e:?}").contains("no_such_db"), "{e:?}");
    a.simple_query(&format!("PAUSE {APP_DB}")).await.unwrap();
    let held = tokio::spawn(async move {
        let started = std::time::Instant::now();
        client.simple_query("SELECT 1").await.unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !held.is_finished(),
        "the database's query waits while paused"
    );
    tokio::time::timeout(Duration::from_secs(2), other.simple_query("SELECT 1"))
        .await
        .expect("another database of the cluster is not paused")
        .unwrap();
    a.simple_query(&format!("RESUME {APP_DB}")).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_get_errors_and_the_session_goes_on() {
    let s = tokio::task::block_in_place(setup);
    // Logins: SCRAM-SHA-256 by default, for known and unknown users alike.
    for user in [CONSOLE_USER, "nobody"] {
        let (code, mechanisms) = auth_request(s.admin_port, user).await;
        assert_eq!(code, 10, "SASL for {user}");
        assert!(
            mechanisms.starts_with(b"SCRAM-SHA-256\0"),
            "{:?}",
            String::from_utf8_lossy(&mechanisms)
        );
    }
    let wrong = try_console_connect(s.admin_port, "nope")
        .await
        .err()
        .map(|e| format!("{e:?}"));
    assert!(
        wrong.is_some_and(|e| e.contains("28P01")),
        "wrong password refused"
    );
    // `admin_auth = "md5"` for older clients: md5 is asked, and works.
    // A second daemon: its own client listener, its own console.
    let md5_port = free_port();
    let mut md5_cfg = s.cfg.clone();
    md5_cfg.listen = format!("127.0.0.1:{}", free_port());
    let md5_daemon =
        FulcrumProcess::start(&console_toml(&md5_cfg, md5_port, "admin_auth = \"md5\"\n")).unwrap();
    assert_eq!(auth_request(md5_port, CONSOLE_USER).await.0, 5, "md5 asked");
    let via_md5 = try_console_connect(md5_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    assert!(!show(&via_md5, "SHOW VERSION").await.1.is_empty());
    let wrong = try_console_connect(md5_port, "nope")
        .await
        .err()
        .map(|e| format!("{e:?}"));
    assert!(
        wrong.is_some_and(|e| e.contains("28P01")),
        "md5: wrong password refused"
    );
    drop(md5_daemon);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    for bad in [
        "SHOW TABLES",
        "DROP TABLE x",
        "DISABLE",
        "DISABLE 10.9.9.9:1",
        "SWITCHOVER main",
        "SET work_mem = 1",
        "PAUSE nosuch",
    ] {
        let e = a.simple_query(bad).await.unwrap_err();
        assert!(e.as_db_error().is_some(), "{bad}: a clear error, got {e:?}");
    }
    let e = a.simple_query("SET log = '[['").await.unwrap_err();
    assert!(format!("{e:?}").contains("invalid log filter"), "{e:?}");
    a.simple_query("SET log = 'debug'").await.unwrap();
    a.simple_query("SET log = 'info'").await.unwrap();
    let (_, v) = show(&a, "SHOW VERSION").await;
    assert!(v[0][0].starts_with("Fulcrum"), "still answering: {v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_under_writes_loses_no_transaction() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    let s = tokio::task::block_in_place(setup);
    s.cluster
        .primary()
        .sql_db(APP_DB, "CREATE TABLE switched (id bigint PRIMARY KEY)")
        .unwrap();
    s.cluster
        .wait_replicas_caught_up(Duration::from_secs(30))
        .unwrap();
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let (cfg, stop, failed, acked) =
                (s.cfg.clone(), stop.clone(), failed.clone(), acked.clone());
            tokio::spawn(async move {
                let c = pg_connect(&cfg).await;
                let mut id = w * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    let r = c
                        .batch_execute(&format!(
                            "BEGIN; INSERT INTO switched VALUES ({id}); COMMIT"
                        ))
                        .await;
                    match r {
                        Ok(()) => acked.lock().unwrap().push(id),
                        Err(e) => {
                            eprintln!("failed: {e:?}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (columns, rows) = show(&a, &format!("SWITCHOVER main TO {}", s.replica_addr)).await;
    assert_eq!(columns, ["cluster", "new_primary", "held_ms"]);
    let held: u64 = rows[0][2].parse().unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "switchover held new work for {held} ms; {} transactions committed, {} failed",
        acked.len(),
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no transaction failed");
    assert!(held < 2000, "writes held {held} ms");
    let c = pg_connect(&s.cfg).await;
    let msgs = c
        .simple_query("/* fulcrum:primary */ SELECT inet_server_port()")
        .await
        .unwrap();
    let port: u16 = msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .unwrap();
    assert_eq!(port, s.replica, "writes go to the new primary");
    let new_primary = &s.cluster.replicas()[0];
    let present = new_primary
        .sql_db(APP_DB, "SELECT count(*) FROM switched")
        .unwrap();
    if present.trim() != acked.len().to_string() {
        let on_new = new_primary
            .sql_db(APP_DB, "SELECT string_agg(id::text, ',') FROM switched")
            .unwrap();
        let on_new: std::collections::HashSet<i64> = on_new
            .trim()
            .split(',')
            .map(|x| x.parse().unwrap())
            .collect();
        let missing: Vec<i64> = acked
            .iter()
            .copied()
            .filter(|i| !on_new.contains(i))
            .collect();
        let on_old = s
            .cluster
            .primary()
            .sql_db(
                APP_DB,
                &format!(
                    "SELECT string_agg(id::text, ',') FROM switched WHERE id IN ({})",
                    missing
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            )
            .unwrap();
        eprintln!("missing on the new primary: {missing:?}; on the old one: {on_old}");
        eprintln!(
            "{}",
            std::fs::read_to_string(s._fulcrum.log_path()).unwrap()
        );
    }
    assert_eq!(
        present.trim(),
        acked.len().to_string(),
        "every committed row is on the new primary"
    );
    let (_, clusters) = show(&a, "SHOW CLUSTERS").await;
    let old = clusters
        .iter()
        .find(|r| r[2] == format!("127.0.0.1:{}", s.primary))
        .unwrap();
    assert_eq!(old[4], "stale", "the old primary is fenced: {clusters:?}");
}

/// The console caps its connections and its login time like the data
/// listeners: idle connections that never log in cannot lock operators
/// out (at most 16 are kept logging in; a new one closes the oldest), a
/// real login among 64 idle sockets is served at once, and an idle
/// connection is closed at the login timeout with FATAL 08P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_connections_are_capped_and_logins_time_out() {
    use tokio::io::AsyncReadExt;
    let s = tokio::task::block_in_place(setup);
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", s.admin_port))
                .await
                .unwrap(),
        );
    }
    let started = std::time::Instant::now();
    // An operator still gets in, at once.
    let console = tokio::time::timeout(
        Duration::from_secs(5),
        try_console_connect(s.admin_port, CONSOLE_PASSWORD),
    )
    .await
    .expect("a login among idle sockets is served at once")
    .unwrap();
    show(&console, "SHOW POOLS").await;
    // The oldest idle sockets were closed to make room.
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), idle[0].read_to_end(&mut reply))
        .await
        .expect("the oldest idle socket was closed")
        .unwrap();
    // The newest is closed at the login timeout, told why.
    let mut last = idle.pop().unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(25), last.read_to_end(&mut reply))
        .await
        .expect("closed at the login timeout")
        .unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(14), "{waited:?}");
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.contains("08P01") && text.contains("login not finished"),
        "{text}"
    );
    drop(idle);
    // And the console still serves.
    show(&console, "SHOW POOLS").await;
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

/// RECONNECT closes server connections once they are idle (a transaction in
/// progress keeps its own until it ends), WAIT_CLOSE waits for that, and
/// KILL ends the database's clients with 57P01 while new ones get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_wait_close_and_kill() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let idle = pg_connect(&s.cfg).await;
    let busy = pg_connect(&s.cfg).await;
    let pid_in_txn = |c: Client| async move {
        c.batch_execute("BEGIN").await.unwrap();
        let rows = c.simple_query("SELECT pg_backend_pid() + 0").await.unwrap();
        let pid: i32 = rows
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(0).map(|v| v.parse().unwrap()),
                _ => None,
            })
            .unwrap();
        (c, pid)
    };
    let (busy, before) = pid_in_txn(busy).await;
    show(&a, "RECONNECT app").await;
    let a2 = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { a2.simple_query("WAIT_CLOSE app").await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !waiting.is_finished(),
        "WAIT_CLOSE waits for the transaction"
    );
    busy.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("WAIT_CLOSE returns once the connection closed")
        .unwrap()
        .unwrap();
    let (busy, after) = pid_in_txn(busy).await;
    assert_ne!(before, after, "a fresh server connection after RECONNECT");
    busy.batch_execute("COMMIT").await.unwrap();
    let gone = s
        .cluster
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {before}"
        ))
        .unwrap();
    assert_eq!(gone.trim(), "0", "the old server connection is closed");

    show(&a, "KILL app").await;
    let err = tokio::time::timeout(Duration::from_secs(5), idle.simple_query("SELECT 1"))
        .await
        .expect("answered")
        .unwrap_err();
    assert!(
        err.as_db_error()
            .is_some_and(|d| d.code().code() == "57P01")
            || idle.is_closed(),
        "{err:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, clients) = show(&a, "SHOW CLIENTS").await;
        if clients.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{clients:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fresh = pg_connect(&s.cfg).await;
    fresh
        .simple_query("SELECT 1")
        .await
        .expect("new clients get in");
    let (_, mem) = show(&a, "SHOW MEM").await;
    let rss: u64 = mem.iter().find(|r| r[0] == "process_rss").unwrap()[3]
        .parse()
        .unwrap();
    assert!(rss > 1024 * 1024, "{mem:?}");
    assert!(
        mem.iter().any(|r| r[0] == "digests" && r[1] == "main"),
        "{mem:?}"
    );
    let err = a.simple_query("KILL").await.unwrap_err();
    assert!(
        err.as_db_error()
            .is_some_and(|d| d.message().contains("usage: KILL")),
        "{err:?}"
    );
}

/// psql to the console on `port` as `user` with `sslmode` (and the CA for
/// verify-ca): (success, stdout, stderr).
fn console_psql(
    port: u16,
    user: &str,
    password: &str,
    sslmode: &str,
    ca: &std::path::Path,
    sql: &str,
) -> (bool, String, String) {
    let out = std::process::Command::new(fulcrum_testkit::pg_bin("psql"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", user])
        .args(["-d", "fulcrum", "-X", "-At", "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", sslmode)
        .env("PGSSLROOTCERT", ca)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// With `[fulcrum] tls_mode = "require"` and a certificate, the console
/// speaks TLS (psql verifies its certificate) and refuses plain logins;
/// a `stats_users` login runs SHOW commands and nothing else.
#[test]
fn console_tls_and_stats_users() {
    let certs = fulcrum_testkit::TestCerts::new().expect("certificates");
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&fulcrum_suite::pg_primary().primary().addr());
    // ([fulcrum]'s tls_* keys are the clusters' defaults too: this
    // cluster's listener requires TLS as well; the test does not use it.)
    let global = format!(
        "tls_mode = \"require\"\ntls_certificate = \"{}\"\ntls_private_key = \"{}\"\n\
         stats_users = [\"watcher\"]\n",
        certs.cert.display(),
        certs.key.display()
    );
    let toml = console_toml(&cfg, admin_port, &global).replacen(
        "[[cluster]]",
        "[[fulcrum.admin_user]]\nname = \"watcher\"\npassword = \"watch-pw\"\n\n[[cluster]]",
        1,
    );
    let f = FulcrumProcess::start(&toml).expect("start fulcrum");
    let (ok, out, err) = console_psql(
        admin_port,
        CONSOLE_USER,
        CONSOLE_PASSWORD,
        "verify-ca",
        &certs.ca,
        "SHOW VERSION",
    );
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(out.contains("ulcrum"), "{out}");
    let (ok, _, err) = console_psql(
        admin_port,
        CONSOLE_USER,
        CONSOLE_PASSWORD,
        "disable",
        &certs.ca,
        "SHOW VERSION",
    );
    assert!(!ok && err.contains("requires TLS"), "{err}");
    // The stats user reads...
    let (ok, out, err) = console_psql(
        admin_port,
        "watcher",
        "watch-pw",
        "require",
        &certs.ca,
        "SHOW POOLS",
    );
    assert!(ok, "{err}");
    let _ = out;
    // ...and changes nothing.
    for command in ["PAUSE", "RELOAD", "SET log = 'debug'", "SHOW QUERIES RESET"] {
        let (ok, _, err) = console_psql(
            admin_port, "watcher", "watch-pw", "require", &certs.ca, command,
        );
        assert!(!ok && err.contains("stats user"), "{command}: {err}");
    }
    // The full admin still can.
    let (ok, _, err) = console_psql(
        admin_port,
        CONSOLE_USER,
        CONSOLE_PASSWORD,
        "require",
        &certs.ca,
        "RESUME",
    );
    assert!(ok, "{err}");
}

/// Debian's `prometheus-pgbouncer-exporter`, pointed at Fulcrum's console
/// as at PgBouncer's, exports its pool, stats, databases and lists series
/// with Fulcrum's real figures; then the console's SHUTDOWN drains and
/// stops the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pgbouncer_exporter_reads_the_console_and_shutdown_stops() {
    let c = fulcrum_suite::pg_primary();
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    // Up by now (start returns once it listens).
    let daemon_started = std::time::Instant::now();
    // Traffic to count, and a client holding a transaction (active).
    let client = pg_connect(&cfg).await;
    for _ in 0..200 {
        client.simple_query("SELECT 1").await.unwrap();
    }
    let holder = pg_connect(&cfg).await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let exporter = fulcrum_testkit::tool(
        "/usr/bin/prometheus-pgbouncer-exporter",
        "prometheus-pgbouncer-exporter",
    );
    let port = free_port();
    let mut child = std::process::Command::new(exporter)
        .args([
            "--pgbouncer-host",
            "127.0.0.1",
            "--pgbouncer-port",
            &admin_port.to_string(),
            "--pgbouncer-user",
            CONSOLE_USER,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("PGPASSWORD", CONSOLE_PASSWORD)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the exporter starts");
    let mut text = String::new();
    for _ in 0..100 {
        // The exporter answers HTTP/1.0: read it whole.
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            let mut t = String::new();
            let _ = s.read_to_string(&mut t);
            if t.contains("pgbouncer_active_clients") {
                text = t;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        !text.is_empty(),
        "the exporter never served its series: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    assert_eq!(
        value(&format!(
            "pgbouncer_active_clients{{database=\"{APP_DB}\",user=\"{APP_USER}\"}}"
        )),
        1.0,
        "the client in its transaction"
    );
    // SHOW STATS names the database as SHOW POOLS does: the labels match.
    assert!(
        value(&format!(
            "pgbouncer_requests_total{{database=\"{APP_DB}\"}}"
        )) >= 200.0
    );
    assert!(
        value(&format!(
            "pgbouncer_received_bytes_total{{database=\"{APP_DB}\"}}"
        )) > 0.0
    );
    assert_eq!(
        value(&format!("pgbouncer_pool_size{{database=\"{APP_DB}\"}}")),
        20.0
    );
    assert_eq!(
        value("pgbouncer_used_clients "),
        2.0,
        "two clients logged in"
    );
    assert!(value("pgbouncer_used_servers ") >= 1.0);
    holder.batch_execute("COMMIT").await.unwrap();

    // PgBouncer's averages: within the first stats period they run from
    // the daemon's start: at least 2 s ago (waited for, so a per-second
    // figure is below its total), 200 units make at least one a second,
    // and each took some time.
    if let Some(rest) = Duration::from_secs(2).checked_sub(daemon_started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let console = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let (columns, rows) = show(&console, "SHOW STATS").await;
    let row = rows
        .iter()
        .find(|r| r[0] == APP_DB)
        .unwrap_or_else(|| panic!("a row for {APP_DB}: {rows:?}"));
    let stat = |name: &str| -> u64 {
        let i = columns.iter().position(|c| c == name).unwrap();
        row[i].parse().unwrap()
    };
    for avg in [
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
        "avg_xact_time",
        "avg_query_time",
    ] {
        assert!(stat(avg) > 0, "{avg}: {columns:?} {row:?}");
    }
    assert!(
        stat("avg_recv") < stat("total_received"),
        "per second: {row:?}"
    );

    // SHUTDOWN drains: the daemon exits by itself.
    console.simple_query("SHUTDOWN").await.unwrap();
    let status = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(30)));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// PgBouncer's `DISABLE db` / `ENABLE db`: new logins to the database are
/// refused (55000, as PostgreSQL says for a database that takes no
/// connections) while connected clients go on; `DISABLE BACKEND` keeps
/// the backend verb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_and_enable_a_database_as_pgbouncer_does() {
    let c = fulcrum_suite::pg_primary();
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let _p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    let connected = pg_connect(&cfg).await;
    let console = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    console
        .simple_query(&format!("DISABLE {APP_DB}"))
        .await
        .unwrap();
    let e = tokio_postgres::connect(&cfg.conn_string(APP_USER, APP_DB), NoTls)
        .await
        .err()
        .expect("a new login to a disabled database is refused");
    assert_eq!(e.code().map(|c| c.code()), Some("55000"), "{e:?}");
    assert!(
        e.as_db_error()
            .is_some_and(|d| d.message().contains("not currently accepting connections")),
        "{e:?}"
    );
    connected
        .simple_query("SELECT 1")
        .await
        .expect("a connected client goes on");
    console
        .simple_query(&format!("ENABLE {APP_DB}"))
        .await
        .unwrap();
    pg_connect(&cfg)
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
    // The backend verb under its own name.
    let e = console
        .simple_query("DISABLE BACKEND 127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("no backend"), "{e:?}");
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
