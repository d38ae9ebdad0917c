//! Binary upgrade, the clients' hand-over: a client idle at the upgrade
//! (over TCP or the Unix socket) moves to the new process with its session (a setting, a server-side
//! prepared statement, a LISTEN, its process id and cancel key) and never
//! notices; a pinned client and a TLS client stay on the old process,
//! counted in SHOW UPGRADE, their cancel requests (sent to the new
//! process's listener) reach them there, and the old process exits once
//! they leave.

use std::time::{Duration, Instant};

use fulcrum_suite::{
    cancel_a_sleep, first_value, rustls_tokio_postgres, upgraded_to, with_console, KillOnDrop,
    PgProxyConfig,
};
use fulcrum_testkit::{
    free_port, FulcrumProcess, PgCluster, ScratchDir, Signal, TestCerts, APP_DB, APP_PASSWORD,
    APP_USER,
};
use tokio_postgres::{AsyncMessage, NoTls};

/// A client whose notifications arrive on the returned channel.
async fn listening_client(
    cfg: &PgProxyConfig,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut conn) = tokio_postgres::connect(&cfg.conn_string(APP_USER, APP_DB), NoTls)
        .await
        .expect("connect through fulcrum");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(n.payload().to_string());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    (client, rx)
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_moves_with_its_session_and_pinned_and_tls_ones_stay() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(0).start()).expect("cluster");
    let certs = TestCerts::new().expect("certificates");
    let mut cfg = PgProxyConfig::new(&c.primary().addr());
    for line in rustls_tokio_postgres::listener_tls(&certs) {
        cfg = cfg.extra(&line);
    }
    // The moved client's first statement waits for the new process's
    // function catalog (as a login does): room for a loaded machine.
    cfg = cfg.extra("function_catalog_wait = \"10s\"");
    let sockets = ScratchDir::new().unwrap();
    cfg = cfg.extra(&format!(
        "unix_socket_dir = \"{}\"",
        sockets.path().display()
    ));
    let admin_port = free_port();
    let p = FulcrumProcess::start(&with_console(&cfg.to_toml(), admin_port)).unwrap();

    let (client, mut notes) = listening_client(&cfg).await;
    client
        .batch_execute("SET app.kept = 'kept-1'")
        .await
        .unwrap();
    let add_one = client.prepare("SELECT $1::int + 1").await.unwrap();
    let two: i32 = client.query_one(&add_one, &[&1i32]).await.unwrap().get(0);
    assert_eq!(two, 2);
    client.batch_execute("LISTEN moved").await.unwrap();
    let pid_before = first_value(&client, "SELECT pg_backend_pid()").await;
    // A pinned client: its temporary table lives on its server connection.
    let (pinned, _) = listening_client(&cfg).await;
    pinned
        .batch_execute("CREATE TEMP TABLE t (x int); INSERT INTO t VALUES (7)")
        .await
        .unwrap();
    // A client of the Unix socket: its socket moves as a TCP one does.
    let port = cfg.listen.rsplit_once(':').unwrap().1.to_string();
    let unix = fulcrum_suite::pg_connect_str(&format!(
        "host={} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB}",
        sockets.path().display()
    ))
    .await
    .expect("connect over the Unix socket");
    unix.batch_execute("SET app.kept = 'unix'").await.unwrap();
    // A TLS client: its session's keys are this process's.
    let tls = rustls_tokio_postgres::connect(&cfg, &certs.ca)
        .await
        .expect("connect over TLS");
    tls.batch_execute("SET app.kept = 'tls'").await.unwrap();

    p.signal(Signal::Usr2).unwrap();
    let mut new_pid = None;
    tokio::task::block_in_place(|| {
        wait_for("the hand-over", Duration::from_secs(60), || {
            new_pid = upgraded_to(&p.log_contents(), 1);
            new_pid.is_some()
        })
    });
    let new_pid = new_pid.unwrap();
    let _successor = KillOnDrop(new_pid);

    // The console is the new process's: the idle client moved, the pinned
    // one stayed.
    let detail = fulcrum_suite::upgrade_clients_row(
        admin_port,
        "2 handed over; left on the old process: 1 TLS, 1 pinned; 0 closed there",
    )
    .await;
    assert_eq!(
        detail, "2 handed over; left on the old process: 1 TLS, 1 pinned; 0 closed there",
        "SHOW UPGRADE's clients row"
    );

    // The moved client's first statement there calls a function: the new
    // process proves it by its own function catalog, read when the client
    // arrived (as at a login), so the client is not pinned for it.
    assert!(!first_value(&client, "SELECT CURRENT_TIMESTAMP::text")
        .await
        .is_empty());
    // The moved clients, on the new process, as before.
    assert_eq!(first_value(&unix, "SHOW app.kept").await, "unix");
    assert_eq!(first_value(&client, "SHOW app.kept").await, "kept-1");
    let four: i32 = client.query_one(&add_one, &[&3i32]).await.unwrap().get(0);
    assert_eq!(four, 4, "the statement prepared before runs by name");
    assert_eq!(
        first_value(&client, "SELECT pg_backend_pid()").await,
        pid_before,
        "the same process id"
    );
    let notifier = fulcrum_suite::pg_connect(&cfg).await;
    notifier
        .batch_execute("NOTIFY moved, 'after the upgrade'")
        .await
        .unwrap();
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .expect("the notification within 10 s");
    assert_eq!(note.as_deref(), Some("after the upgrade"));
    // Its cancel key reaches it on the new process.
    cancel_a_sleep(&client, None).await;

    // The old process still holds the pinned and TLS clients, which work
    // there.
    assert!(
        p.try_wait().is_none(),
        "the old process stays for its clients"
    );
    assert_eq!(first_value(&pinned, "SELECT x FROM t").await, "7");
    assert_eq!(first_value(&tls, "SHOW app.kept").await, "tls");
    // Their cancel requests reach the new process's listener, which
    // passes them back to the old process.
    cancel_a_sleep(&pinned, None).await;
    cancel_a_sleep(&tls, Some(&certs.ca)).await;
    drop(pinned);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        p.try_wait().is_none(),
        "the old process stays for its TLS client"
    );
    drop(tls);
    assert!(
        p.wait_exit(Duration::from_secs(20)).is_some(),
        "the old process exits once its clients left:\n{}",
        p.log_contents()
    );
    assert_eq!(first_value(&client, "SHOW app.kept").await, "kept-1");

    // The call it made first on the new process left it unpinned (see
    // above): a second upgrade moves it again, and the second process exits.
    assert!(std::process::Command::new("kill")
        .args(["-USR2", &new_pid.to_string()])
        .status()
        .unwrap()
        .success());
    let mut newest = None;
    tokio::task::block_in_place(|| {
        wait_for("the second hand-over", Duration::from_secs(60), || {
            newest = upgraded_to(&p.log_contents(), 2);
            newest.is_some()
        })
    });
    let _newest = KillOnDrop(newest.unwrap());
    tokio::task::block_in_place(|| {
        wait_for("the second process's exit", Duration::from_secs(20), || {
            !std::path::Path::new(&format!("/proc/{new_pid}/cmdline")).exists()
                || std::fs::read_to_string(format!("/proc/{new_pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        })
    });
    assert_eq!(first_value(&client, "SHOW app.kept").await, "kept-1");
    let five: i32 = client.query_one(&add_one, &[&4i32]).await.unwrap().get(0);
    assert_eq!(five, 5);
}
