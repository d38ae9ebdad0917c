//! Binary upgrade, the MySQL clients' hand-over: a client in a transaction
//! at the upgrade moves to the new process at its COMMIT with its session
//! (its connection id, kept though a client logged in to the new process
//! meanwhile; its schema, a session variable, its character set, its read
//! consistency and a server-side prepared statement) and never notices; a
//! pinned client (a user variable) stays on the old process, counted in
//! SHOW UPGRADE, and the old process exits once it leaves, the moved client
//! still served (and `KILL <id>` through the new process reaching it). An
//! idle client of the Unix socket moves too, with its id and a setting.

use std::path::Path;
use std::time::Duration;

use fulcrum_suite::{
    maria_connect, maria_one_replica, maria_toml, upgraded_to, with_console, KillOnDrop,
};
use fulcrum_testkit::{
    free_port, wait_for_unix, FulcrumProcess, ScratchDir, Signal, APP_DB, APP_PASSWORD, APP_USER,
};
use mysql_async::prelude::Queryable;

/// The first column of the first row of `sql`, as text.
async fn one(c: &mut mysql_async::Conn, sql: &str) -> String {
    let v: Option<String> = c
        .query_first(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    v.unwrap_or_else(|| panic!("{sql}: no row"))
}

/// A login over the Unix socket at `socket`.
async fn socket_login(socket: &Path) -> mysql_async::Conn {
    let opts = mysql_async::OptsBuilder::default()
        .socket(Some(socket.display().to_string()))
        .user(Some(APP_USER))
        .pass(Some(APP_PASSWORD))
        .db_name(Some(APP_DB));
    mysql_async::Conn::new(opts)
        .await
        .expect("login over the socket")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_client_moves_at_its_commit_with_its_session_and_a_pinned_one_stays() {
    let c = tokio::task::block_in_place(maria_one_replica);
    let (port, admin_port) = (free_port(), free_port());
    let dir = ScratchDir::new().unwrap();
    let socket = dir.path().join("fulcrum.sock");
    let keys = format!("unix_socket = \"{}\"\n", socket.display());
    let p = FulcrumProcess::start(&with_console(&maria_toml(c, port, &keys), admin_port))
        .expect("fulcrum");
    assert!(wait_for_unix(&socket, Duration::from_secs(10)));

    let mut client = maria_connect(port).await;
    let id = client.id();
    client.query_drop("USE information_schema").await.unwrap();
    client
        .query_drop("SET @@session.sql_mode = 'ANSI_QUOTES'")
        .await
        .unwrap();
    // Not the login's utf8mb4: the new server connection must be told.
    client.query_drop("SET NAMES latin1").await.unwrap();
    client
        .query_drop("SET fulcrum.consistency = 'strong'")
        .await
        .unwrap();
    let add_one = client.prep("SELECT ? + 1").await.unwrap();
    let two: i64 = client.exec_first(&add_one, (1,)).await.unwrap().unwrap();
    assert_eq!(two, 2);
    // In a transaction at the upgrade: it moves at its COMMIT.
    client.query_drop("BEGIN").await.unwrap();
    assert_eq!(
        one(&mut client, "SELECT @@session.sql_mode").await,
        "ANSI_QUOTES"
    );
    // An idle client of the Unix socket, with a setting of its own.
    let mut local = socket_login(&socket).await;
    let local_id = local.id();
    local
        .query_drop("SET @@session.time_zone = '+02:00'")
        .await
        .unwrap();
    // A pinned client: its user variable lives on its server connection.
    let mut pinned = maria_connect(port).await;
    pinned.query_drop("SET @kept = 7").await.unwrap();

    p.signal(Signal::Usr2).unwrap();
    tokio::task::block_in_place(|| {
        p.wait_for_log("handed over to process", Duration::from_secs(60))
            .unwrap()
    });
    let new_pid = upgraded_to(&p.log_contents(), 1).expect("handed over");
    let _successor = KillOnDrop(new_pid);

    // A client of the new process, logged in before the other moves: its
    // id is past every id the old process gave, so none is taken twice.
    let mut fresh = maria_connect(port).await;
    assert!(
        fresh.id() > id,
        "the new process's ids ({}) are past the old one's ({id})",
        fresh.id()
    );
    client.query_drop("COMMIT").await.unwrap();

    // The console is the new process's: the client moved at its
    // transaction's end, the pinned one stayed.
    let want = "2 handed over; left on the old process: 0 TLS, 1 pinned; 0 closed there";
    assert_eq!(
        fulcrum_suite::upgrade_clients_row(admin_port, want).await,
        want,
        "SHOW UPGRADE's clients row"
    );

    // The pinned client works on the old process, which stays for it.
    assert!(
        p.try_wait().is_none(),
        "the old process stays for its pinned client"
    );
    assert_eq!(one(&mut pinned, "SELECT @kept").await, "7");
    pinned.disconnect().await.unwrap();
    let exited = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(20)));
    assert!(
        exited.is_some(),
        "the old process exits once its pinned client left:\n{}",
        p.log_contents()
    );

    // The moved client, connected all along, on the new process as before.
    assert_eq!(
        one(&mut client, "SELECT CONNECTION_ID()").await,
        id.to_string(),
        "the same connection id"
    );
    assert_eq!(
        one(&mut client, "SELECT DATABASE()").await,
        "information_schema"
    );
    assert_eq!(
        one(&mut client, "SELECT @@session.sql_mode").await,
        "ANSI_QUOTES"
    );
    assert_eq!(
        one(&mut client, "SELECT @@character_set_client").await,
        "latin1"
    );
    assert_eq!(one(&mut client, "SHOW fulcrum.consistency").await, "strong");
    let four: i64 = client.exec_first(&add_one, (3,)).await.unwrap().unwrap();
    assert_eq!(four, 4, "the statement prepared before runs by its id");
    assert_eq!(
        one(&mut local, "SELECT CONNECTION_ID()").await,
        local_id.to_string()
    );
    assert_eq!(
        one(&mut local, "SELECT @@session.time_zone").await,
        "+02:00"
    );
    local.disconnect().await.unwrap();
    // `KILL <id>` from a client of the new process reaches it: its id is
    // registered there.
    let killer = &mut fresh;
    killer
        .query_drop(format!("KILL {id}"))
        .await
        .expect("KILL names a client of the new process");
    assert!(
        client.query_drop("SELECT 1").await.is_err(),
        "the moved client was killed"
    );
    fresh.disconnect().await.unwrap();
}
