//! End-to-end check of the MariaDB side of the harness: one static primary
//! with two GTID replicas for the whole binary (the reaper removes it when the
//! process exits), writes as `app` over TCP with the real `mariadb` client,
//! replication to every replica, read-only replicas refusing `app`'s writes
//! with ERROR 1290, and a killed replica resuming replication after a restart.

use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    run_mariadb, MariaCluster, MariaNode, TestkitError, APP_DB, APP_PASSWORD, APP_USER,
    RESERVED_PORTS,
};

static CLUSTER: LazyLock<MariaCluster> = LazyLock::new(|| {
    let started = Instant::now();
    let cluster = MariaCluster::builder()
        .replicas(2)
        .setting("max-connections", "100")
        .start()
        .expect("start MariaDB primary + 2 replicas");
    eprintln!(
        "MariaDB primary + 2 replicas started in {:?} ({})",
        started.elapsed(),
        cluster.dir().display()
    );
    cluster
});

/// Tests that wait for every replica or restart one take turns: a catch-up
/// wait must not meet a replica another test is restarting.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn app_sql(node: &MariaNode, sql: &str) -> Result<String, TestkitError> {
    run_mariadb(&node.addr(), APP_USER, APP_PASSWORD, APP_DB, sql)
}

fn caught_up() {
    let t = Instant::now();
    CLUSTER
        .wait_replicas_caught_up(Duration::from_secs(10))
        .unwrap();
    eprintln!("replicas caught up in {:?}", t.elapsed());
}

#[test]
fn app_writes_on_the_primary_over_tcp_reach_every_replica() {
    let primary = CLUSTER.primary();
    assert_eq!(CLUSTER.replicas().len(), 2);
    for node in CLUSTER.nodes() {
        assert!(
            !RESERVED_PORTS.contains(&node.port()),
            "{} on reserved port {}",
            node.name(),
            node.port()
        );
        assert!(node.socket().starts_with(CLUSTER.dir()));
        assert!(node.data_dir().starts_with(CLUSTER.dir()));
    }
    assert_eq!(primary.addr(), format!("127.0.0.1:{}", primary.port()));
    assert_eq!(primary.sql("SELECT @@max_connections").unwrap(), "100");

    app_sql(
        primary,
        "CREATE TABLE smoke (id int PRIMARY KEY, note varchar(40)); \
         INSERT INTO smoke VALUES (1, 'one'), (2, 'two'), (3, 'three')",
    )
    .unwrap();
    assert_eq!(
        app_sql(primary, "SELECT count(*), max(id) FROM smoke").unwrap(),
        "3\t3"
    );

    let _turn = serial();
    caught_up();
    for replica in CLUSTER.replicas() {
        assert_eq!(
            replica
                .sql("SELECT group_concat(note ORDER BY id) FROM smoke")
                .unwrap(),
            "one,two,three",
            "{}",
            replica.name()
        );
        // `app` reads on replicas over TCP too.
        assert_eq!(app_sql(replica, "SELECT count(*) FROM smoke").unwrap(), "3");
        assert_eq!(
            replica.gtid_slave_pos().unwrap(),
            primary.gtid_binlog_pos().unwrap()
        );
    }
}

#[test]
fn replicas_are_read_only_and_refuse_app_writes_with_1290() {
    let primary = CLUSTER.primary();
    assert!(!primary.read_only().unwrap());
    // app holds database privileges only: nothing lets it bypass read_only.
    let grants = primary.sql("SHOW GRANTS FOR 'app'@'%'").unwrap();
    assert!(
        grants.contains("GRANT USAGE ON *.* TO `app`@`%`")
            && grants.contains("GRANT ALL PRIVILEGES ON `app`.* TO `app`@`%`")
            && !grants.contains("SUPER")
            && !grants.contains("READ ONLY ADMIN"),
        "{grants}"
    );

    app_sql(primary, "CREATE TABLE ro_probe (x int)").unwrap();
    {
        let _turn = serial();
        caught_up();
    }
    for replica in CLUSTER.replicas() {
        assert!(replica.read_only().unwrap(), "{}", replica.name());
        for write in [
            "INSERT INTO ro_probe VALUES (1)",
            "CREATE TABLE ro_new (x int)",
        ] {
            let err = app_sql(replica, write).unwrap_err();
            assert!(matches!(err, TestkitError::CommandFailed { .. }), "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains("ERROR 1290") && msg.contains("--read-only"),
                "{}: {write}: {msg}",
                replica.name()
            );
        }
        assert_eq!(replica.sql("SELECT count(*) FROM ro_probe").unwrap(), "0");
    }
}

#[test]
fn a_killed_replica_restarts_and_resumes_replication() {
    let _turn = serial();
    let primary = CLUSTER.primary();
    let replica = &CLUSTER.replicas()[1];
    let port = replica.port();
    app_sql(
        primary,
        "CREATE TABLE restart_probe (id int PRIMARY KEY, note varchar(40)); \
         INSERT INTO restart_probe VALUES (1, 'before')",
    )
    .unwrap();
    caught_up();

    let t = Instant::now();
    replica.stop_immediate().unwrap();
    assert!(!replica.is_running());
    assert!(replica.pid().is_none());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    // Stopped replicas are skipped by catch-up waits.
    app_sql(
        primary,
        "INSERT INTO restart_probe VALUES (2, 'while down')",
    )
    .unwrap();
    caught_up();

    replica.start().unwrap();
    assert!(replica.is_running());
    assert_eq!(replica.port(), port);
    eprintln!("replica killed and restarted in {:?}", t.elapsed());
    app_sql(primary, "INSERT INTO restart_probe VALUES (3, 'after')").unwrap();
    caught_up();
    assert_eq!(
        replica
            .sql("SELECT group_concat(note ORDER BY id) FROM restart_probe")
            .unwrap(),
        "before,while down,after"
    );
    let status = replica
        .slave_status()
        .unwrap()
        .expect("replication configured");
    assert_eq!(status["Slave_IO_Running"], "Yes");
    assert_eq!(status["Slave_SQL_Running"], "Yes");
    assert_eq!(status["Using_Gtid"], "Slave_Pos");
    assert!(replica.read_only().unwrap(), "read_only after restart");
    assert!(replica.start().is_err(), "a second start must be refused");

    // A clean stop and start resume replication as well.
    let t = Instant::now();
    replica.stop_fast().unwrap();
    assert!(!replica.is_running());
    assert!(replica.stop_fast().is_err(), "stopping a stopped node");
    replica.start().unwrap();
    eprintln!("replica stopped cleanly and restarted in {:?}", t.elapsed());
    app_sql(
        primary,
        "INSERT INTO restart_probe VALUES (4, 'after clean stop')",
    )
    .unwrap();
    caught_up();
    assert_eq!(
        replica
            .sql("SELECT note FROM restart_probe WHERE id = 4")
            .unwrap(),
        "after clean stop"
    );
}

#[test]
fn invalid_settings_are_refused_before_starting_anything() {
    let err = MariaCluster::builder()
        .setting("port=1 --datadir", "/tmp")
        .start()
        .unwrap_err();
    assert!(
        err.to_string().contains("not a MariaDB option name"),
        "{err}"
    );
}
