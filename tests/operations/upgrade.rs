//! Binary upgrade (SIGUSR2, the console's UPGRADE): the new process takes
//! the listening sockets and pgbench's clients while pgbench runs (no
//! client aborted, no failed transaction, the old process exits once its
//! clients moved), twice in a row under the same run; and a new process that fails its config check leaves the old one
//! serving, its clients undisturbed; clients left on the old process end at
//! `upgrade_timeout`. The clients' own hand-over: `upgrade_clients.rs`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fulcrum_suite::{
    console_connect, pg_connect, upgraded_to, with_console, with_metrics, KillOnDrop, PgProxyConfig,
};
use fulcrum_testkit::{
    free_port, pgbench, FulcrumProcess, PgCluster, Signal, APP_DB, APP_PASSWORD, APP_USER,
};

/// The pid of the `nth` (from 1) hand-over the log names, waiting up to 60 s.
fn handed_to(p: &FulcrumProcess, nth: usize) -> u32 {
    let start = Instant::now();
    loop {
        let log = p.log_contents();
        if let Some(pid) = upgraded_to(&log, nth) {
            return pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no hand-over #{nth} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SHOW UPGRADE's rows, each column as text.
async fn show_upgrade(console: &tokio_postgres::Client) -> Vec<Vec<String>> {
    console
        .simple_query("SHOW UPGRADE")
        .await
        .unwrap()
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

fn wait_gone(pid: u32, within: Duration) -> bool {
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn port_of(cfg: &PgProxyConfig) -> String {
    cfg.listen.rsplit_once(':').unwrap().1.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_hands_listeners_and_clients_over_under_pgbench_twice_in_a_row() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .replica(&c.replicas()[0].addr())
        .pool_size(10);
    let metrics_port = free_port();
    let p = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics_port)).unwrap();
    let port = port_of(&cfg);
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["-h", "127.0.0.1", "-p", &port, "-U", APP_USER]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push(APP_DB.to_string());
        a
    };
    let init = args(&["-i", "-q", "-s", "1"]);
    let init: Vec<&str> = init.iter().map(String::as_str).collect();
    let out = tokio::task::block_in_place(|| pgbench(&init, Some(APP_PASSWORD))).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // TPC-B, prepared, 8 clients, 12 s, with SIGUSR2 at 4 s, and again
    // (to the process the first started) at 8 s.
    let run = args(&[
        "-M", "prepared", "-c", "8", "-j", "2", "-T", "12", "-P", "1",
    ]);
    let bench = Command::new(fulcrum_testkit::pg_bin("pgbench"))
        .args(&run)
        .env("PGPASSWORD", APP_PASSWORD)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgbench");
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let signalled = Instant::now();
    p.signal(Signal::Usr2).unwrap();
    let first = handed_to(&p, 1);
    let _first = KillOnDrop(first);
    eprintln!(
        "handed over to {first} {:?} after SIGUSR2 (pgbench at {:?})",
        signalled.elapsed(),
        signalled - started
    );
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(started.elapsed())).await;
    let signalled = Instant::now();
    assert!(Command::new("kill")
        .args(["-USR2", &first.to_string()])
        .status()
        .unwrap()
        .success());
    let second = handed_to(&p, 2);
    let _second = KillOnDrop(second);
    assert_ne!(first, second);
    eprintln!(
        "handed over again, to {second}, {:?} after SIGUSR2 (pgbench at {:?})",
        signalled.elapsed(),
        signalled - started
    );
    let out = tokio::task::block_in_place(|| bench.wait_with_output()).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "pgbench failed across the upgrades:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("aborted"), "{stderr}");
    assert!(
        stdout.contains("number of failed transactions: 0"),
        "{stdout}"
    );
    // pgbench's clients moved to the newest process: both older ones exit.
    assert!(
        p.wait_exit(Duration::from_secs(20)).is_some(),
        "the first process did not exit:\n{}",
        p.log_contents()
    );
    assert!(
        wait_gone(first, Duration::from_secs(20)),
        "the second process did not exit"
    );
    assert!(alive(second));
    // The listener is the newest process's: a new client is served.
    let client = pg_connect(&cfg).await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    let text = tokio::task::block_in_place(|| fulcrum_suite::scrape(metrics_port));
    assert!(
        text.contains("fulcrum_upgrade_clients{state=\"handed_over\"} 8"),
        "the newest process took pgbench's 8 clients:\n{text}"
    );
    let client = pg_connect(&cfg).await;
    let three: i32 = client.query_one("SELECT 3", &[]).await.unwrap().get(0);
    assert_eq!(three, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_failing_its_config_check_leaves_the_old_one_serving() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(0).start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr());
    let admin_port = free_port();
    let toml = with_console(&cfg.to_toml(), admin_port);
    let p = FulcrumProcess::start(&toml).unwrap();
    let client = pg_connect(&cfg).await;
    client.batch_execute("BEGIN").await.unwrap();
    client.simple_query("SELECT 1").await.unwrap();

    std::fs::write(p.config_path(), toml.replacen("pool_size", "pool_sise", 1)).unwrap();
    p.signal(Signal::Usr2).unwrap();
    p.wait_for_log(
        "upgrade failed, this process keeps serving",
        Duration::from_secs(30),
    )
    .unwrap();
    let log = p.log_contents();
    assert!(log.contains("exited (exit status: 2)"), "{log}");
    assert!(
        log.contains("pool_sise"),
        "the new process's config error is in the log:\n{log}"
    );
    // The console's UPGRADE says the same.
    let admin = console_connect(admin_port).await;
    let e = admin.simple_query("UPGRADE").await.unwrap_err();
    assert!(format!("{e:?}").contains("upgrade failed"), "{e:?}");
    // SHOW UPGRADE lists both attempts, failed, with why.
    let rows = show_upgrade(&admin).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        assert_eq!(
            (row[0].as_str(), row[2].as_str()),
            ("upgrade", "failed"),
            "{rows:?}"
        );
        assert!(row[5].contains("exit status: 2"), "{rows:?}");
    }
    // Nothing was disturbed: the transaction goes on, new clients come.
    client.simple_query("SELECT 2").await.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    let other = pg_connect(&cfg).await;
    other.simple_query("SELECT 3").await.unwrap();
    assert!(p.try_wait().is_none(), "the old process still runs");
    // A good file again: the upgrade goes through.
    std::fs::write(p.config_path(), &toml).unwrap();
    let msgs = admin.simple_query("UPGRADE").await.unwrap();
    let summary = format!("{msgs:?}");
    assert!(summary.contains("handed over to process"), "{summary}");
    let pid = handed_to(&p, 1);
    let _successor = KillOnDrop(pid);
    // The console's listener is the new process's now: it says it took over.
    let fresh = console_connect(admin_port).await;
    let rows = show_upgrade(&fresh).await;
    // Its row, and the clients' (both idle ones moved here).
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[1][0], "clients", "{rows:?}");
    assert_eq!(
        (
            rows[0][0].as_str(),
            rows[0][2].as_str(),
            rows[0][3].as_str()
        ),
        ("took_over", "serving", pid.to_string().as_str()),
        "{rows:?}"
    );
    drop((client, other, admin, fresh));
    assert!(
        p.wait_exit(Duration::from_secs(20)).is_some(),
        "the old process exits once its clients left"
    );
    pg_connect(&cfg)
        .await
        .simple_query("SELECT 4")
        .await
        .unwrap();
}

/// `upgrade_timeout`: a client left on the old process (pinned: its
/// temporary table cannot move) is ended when it runs out, at its
/// transaction boundary, with the reconnectable shutdown error (57P01); one
/// in a transaction finishes it first. Then the old process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_left_on_the_old_process_end_at_upgrade_timeout() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(0).start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr());
    let toml = cfg
        .to_toml()
        .replacen("[fulcrum]\n", "[fulcrum]\nupgrade_timeout = \"2s\"\n", 1);
    let p = FulcrumProcess::start(&toml).unwrap();
    let idle = pg_connect(&cfg).await;
    idle.batch_execute("CREATE TEMP TABLE pin (x int)")
        .await
        .unwrap();
    let busy = pg_connect(&cfg).await;
    busy.batch_execute("CREATE TEMP TABLE pin (x int)")
        .await
        .unwrap();
    busy.batch_execute("BEGIN").await.unwrap();
    busy.simple_query("SELECT 1").await.unwrap();
    p.signal(Signal::Usr2).unwrap();
    let pid = handed_to(&p, 1);
    let _successor = KillOnDrop(pid);
    // Within the timeout both are served by the old process.
    idle.simple_query("SELECT 2").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Past it: the idle client was ended with 57P01.
    let e = idle
        .simple_query("SELECT 3")
        .await
        .expect_err("ended at upgrade_timeout");
    let ended = e.as_db_error().map(|d| d.code().code().to_string());
    assert!(
        ended.as_deref() == Some("57P01") || e.is_closed(),
        "ended with the shutdown error or a closed connection: {e:?}"
    );
    // The one in a transaction finishes it, and is ended after.
    busy.simple_query("SELECT 4").await.unwrap();
    busy.batch_execute("COMMIT").await.unwrap();
    assert!(
        p.wait_exit(Duration::from_secs(20)).is_some(),
        "the old process exits when its last client is ended:\n{}",
        p.log_contents()
    );
    assert!(p.log_contents().contains("upgrade_timeout reached"));
    // New clients are the new process's.
    pg_connect(&cfg)
        .await
        .simple_query("SELECT 5")
        .await
        .unwrap();
}
