//! End-to-end check of the PostgreSQL side of the harness: a real primary with
//! two streaming replicas, the per-method test roles over TCP, pgbench, node
//! restart and promotion, and tear-down.

use std::time::{Duration, Instant};

use fulcrum_testkit::{
    pgbench_init, run_pgbench, run_psql, PgCluster, PgNode, TestkitError, APP_DB, APP_MD5_USER,
    APP_PASSWORD, APP_PLAIN_USER, APP_TRUST_USER, APP_USER,
};

fn describe(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

async fn session_user_over_tcp(
    node: &PgNode,
    user: &str,
    password: &str,
) -> Result<String, String> {
    let (client, connection) = tokio_postgres::connect(
        &node.conn_string(user, password, APP_DB),
        tokio_postgres::NoTls,
    )
    .await
    .map_err(describe)?;
    tokio::spawn(connection);
    let row = client
        .query_one("SELECT session_user::text", &[])
        .await
        .map_err(describe)?;
    Ok(row.get(0))
}

#[tokio::test]
async fn primary_with_two_replicas_replicates_authenticates_benchmarks_and_cleans_up() {
    let started = Instant::now();
    let cluster = PgCluster::builder()
        .replicas(2)
        // Lets the test see which auth method each login really used.
        .setting("log_connections", "on")
        .start()
        .expect("start primary + 2 replicas");
    let startup = started.elapsed();
    eprintln!(
        "primary + 2 replicas started in {startup:?} ({})",
        cluster.dir().display()
    );

    let primary = cluster.primary();
    let replicas = cluster.replicas();
    assert_eq!(replicas.len(), 2);
    for port in cluster.nodes().map(PgNode::port) {
        assert!(
            ![5432, 3306, 6432].contains(&port),
            "harness used a reserved port {port}"
        );
    }
    assert_eq!(primary.addr(), format!("127.0.0.1:{}", primary.port()));

    // Replication.
    primary
        .sql(
            "CREATE TABLE smoke (id int PRIMARY KEY, note text); \
              INSERT INTO smoke SELECT g, 'row ' || g FROM generate_series(1, 100) g",
        )
        .unwrap();
    let t = Instant::now();
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .unwrap();
    eprintln!("replicas caught up in {:?}", t.elapsed());
    for replica in replicas {
        assert!(
            replica.is_in_recovery().unwrap(),
            "{} not in recovery",
            replica.name()
        );
        assert_eq!(
            replica
                .sql("SELECT count(*), max(note) FROM smoke")
                .unwrap(),
            "100|row 99"
        );
    }
    assert!(!primary.is_in_recovery().unwrap());
    let streaming = primary
        .sql_db("postgres", "SELECT string_agg(application_name || ':' || state, ',' ORDER BY application_name) FROM pg_stat_replication")
        .unwrap();
    assert_eq!(streaming, "replica1:streaming,replica2:streaming");

    // Passwords are stored the way each auth method needs.
    let stored = primary
        .sql_db(
            "postgres",
            "SELECT string_agg(rolname || '=' || left(rolpassword, 3), ',' ORDER BY rolname) \
                             FROM pg_authid WHERE rolname LIKE 'app%'",
        )
        .unwrap();
    assert_eq!(stored, "app=SCR,app_md5=md5,app_plain=SCR,app_trust=SCR");

    // Each role over TCP, through the method pg_hba.conf assigns it.
    for (user, method) in [
        (APP_USER, "scram-sha-256"),
        (APP_MD5_USER, "md5"),
        (APP_PLAIN_USER, "password"),
    ] {
        let who = session_user_over_tcp(primary, user, APP_PASSWORD).await;
        assert_eq!(who.as_deref(), Ok(user), "{user} via {method}");
        let needle = format!("identity=\"{user}\" method={method}");
        assert!(
            primary.log_contents().contains(&needle),
            "no `{needle}` in the primary log"
        );
        let wrong = session_user_over_tcp(primary, user, "wrong")
            .await
            .unwrap_err();
        assert!(
            wrong.contains("password authentication failed"),
            "{user}: {wrong}"
        );
    }
    let trusted = session_user_over_tcp(primary, APP_TRUST_USER, "anything").await;
    assert_eq!(trusted.as_deref(), Ok(APP_TRUST_USER));
    let via_psql = run_psql(
        &primary.addr(),
        APP_PLAIN_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT count(*) FROM smoke",
    );
    assert_eq!(via_psql.unwrap(), "100");

    // pgbench straight at the primary, then read-only at a replica.
    let t = Instant::now();
    pgbench_init(&primary.addr(), APP_USER, APP_PASSWORD, APP_DB, 1).unwrap();
    let rw = run_pgbench(
        &primary.addr(),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        &["-S", "-t", "50"],
    )
    .unwrap();
    assert_eq!((rw.transactions, rw.failed), (50, 0), "{}", rw.stdout);
    assert!(rw.tps > 0.0);
    // pgbench's -d means --debug; the harness must pass the database positionally.
    assert!(
        !rw.stderr.contains("executing script"),
        "pgbench ran in debug mode"
    );
    cluster
        .wait_replicas_caught_up(Duration::from_secs(30))
        .unwrap();
    let ro = run_pgbench(
        &replicas[0].addr(),
        APP_MD5_USER,
        APP_PASSWORD,
        APP_DB,
        &["-S", "-t", "50"],
    )
    .unwrap();
    assert_eq!(ro.transactions, 50, "{}", ro.stdout);
    eprintln!(
        "pgbench -i -s 1 and two -S -t 50 runs took {:?} (primary {:.0} tps)",
        t.elapsed(),
        rw.tps
    );

    // Stop and start a replica on the same port; it streams again.
    let replica2 = &replicas[1];
    let port = replica2.port();
    replica2.stop_fast().unwrap();
    assert!(!replica2.is_running());
    replica2.start().unwrap();
    assert!(replica2.is_running());
    assert_eq!(replica2.port(), port);
    primary
        .sql("INSERT INTO smoke VALUES (101, 'after restart')")
        .unwrap();
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        replica2
            .sql("SELECT note FROM smoke WHERE id = 101")
            .unwrap(),
        "after restart"
    );

    // Promotion: the replica takes writes and catch-up waits skip it.
    replica2.promote().unwrap();
    assert!(!replica2.is_in_recovery().unwrap());
    replica2
        .sql("INSERT INTO smoke VALUES (102, 'on the promoted node')")
        .unwrap();
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .unwrap();

    // SQL errors name the node.
    let err = replicas[0]
        .sql("INSERT INTO smoke VALUES (1, 'x')")
        .unwrap_err();
    assert!(matches!(err, TestkitError::CommandFailed { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("replica1") && msg.contains("read-only transaction"),
        "{msg}"
    );

    // Stopping a node makes the crash-like stop visible to clients.
    replicas[0].stop_immediate().unwrap();
    assert!(run_psql(
        &replicas[0].addr(),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT 1"
    )
    .is_err());

    // Tear-down stops everything and removes the directory.
    let dir = cluster.dir().to_path_buf();
    let ports: Vec<u16> = cluster.nodes().map(PgNode::port).collect();
    let t = Instant::now();
    drop(cluster);
    eprintln!("tear-down took {:?}", t.elapsed());
    assert!(!dir.exists(), "{} still exists", dir.display());
    for port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} still open"
        );
    }
}

#[test]
fn synchronous_standby_cluster_has_a_sync_replica() {
    let started = Instant::now();
    let cluster = PgCluster::builder()
        .replicas(1)
        .synchronous_standby(true)
        .max_connections(50)
        .start()
        .expect("start synchronous cluster");
    eprintln!(
        "primary + 1 synchronous replica started in {:?}",
        started.elapsed()
    );
    let primary = cluster.primary();
    assert_eq!(
        primary
            .sql_db(
                "postgres",
                "SELECT application_name, sync_state FROM pg_stat_replication"
            )
            .unwrap(),
        "replica1|sync"
    );
    assert_eq!(primary.sql("SHOW synchronous_commit").unwrap(), "on");
    assert_eq!(primary.sql("SHOW max_connections").unwrap(), "50");
    // A synchronous commit is visible on the standby once it returns... after replay.
    primary
        .sql("CREATE TABLE s (x int); INSERT INTO s VALUES (1)")
        .unwrap();
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .unwrap();
    assert_eq!(cluster.replicas()[0].sql("SELECT x FROM s").unwrap(), "1");
}

#[test]
fn invalid_builder_options_are_refused_before_starting_anything() {
    let err = PgCluster::builder()
        .synchronous_standby(true)
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("at least one replica"), "{err}");
    let err = PgCluster::builder()
        .setting("fsync = off\nport", "1")
        .start()
        .unwrap_err();
    assert!(
        err.to_string().contains("not a PostgreSQL parameter name"),
        "{err}"
    );
}
