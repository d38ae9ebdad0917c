//! Bad logins and connection floods: bad SCRAM messages, wrong passwords and
//! unknown users failing alike, unknown databases, floods of idle connects,
//! `max_client_connections`, `client_login_timeout` and a backend down at
//! connect.

use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use fulcrum_suite::{pg_primary, startup_message, PROTOCOL_3_0};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER, START_TIMEOUT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::helpers::{
    addr, app_startup, assert_unharmed, bystander, conn_string, connect, db_error, error_fields,
    header, query, select_1, start_fulcrum, Raw, IO_TIMEOUT, PROTOCOL_VIOLATION, SCRAM,
};

/// The SQLSTATE, severity and message of a refused login.
async fn login_error(conn_string: &str) -> (String, String, String) {
    match connect(conn_string).await {
        Ok(_) => panic!("login succeeded: {conn_string}"),
        Err(e) => db_error(&e),
    }
}

// ---- authentication and backends ---------------------------------------------------------

/// The authentication request a user gets right after the StartupMessage:
/// its kind, and its payload unless the kind is md5 (whose salt is random).
async fn first_auth_request(addr: &str, user: &str) -> (i32, Bytes) {
    let mut raw = Raw::connect(addr).await;
    raw.send(&startup_message(
        PROTOCOL_3_0,
        &[("user", user), ("database", APP_DB)],
    ))
    .await;
    let (tag, mut body) = raw.recv().await.expect("an authentication request");
    assert_eq!(tag, b'R', "{body:?}");
    let kind = body.get_i32();
    (kind, if kind == 5 { Bytes::new() } else { body })
}

async fn assert_wrong_password_and_unknown_user_fail_alike(fulcrum: &FulcrumProcess) {
    let bystander = bystander(fulcrum).await;
    let addr = addr(fulcrum);
    let wrong_password =
        login_error(&conn_string(&addr, APP_USER, "not-the-password", APP_DB)).await;
    let unknown_user = login_error(&conn_string(&addr, "nobody", APP_PASSWORD, APP_DB)).await;
    let expected = |user: &str| {
        (
            "28P01".to_owned(),
            "FATAL".to_owned(),
            format!("password authentication failed for user \"{user}\""),
        )
    };
    assert_eq!(wrong_password, expected(APP_USER));
    assert_eq!(unknown_user, expected("nobody"));
    // Both are asked the same question first, so the exchange gives nothing away.
    assert_eq!(
        first_auth_request(&addr, APP_USER).await,
        first_auth_request(&addr, "nobody").await
    );
    assert_unharmed(fulcrum, &bystander).await;
}

#[tokio::test]
async fn bad_message_during_scram_exchange_gets_fatal_08p01() {
    let bystander = bystander(&SCRAM).await;
    let sasl_initial = |mechanism: &str, data: &[u8]| {
        let mut body = mechanism.as_bytes().to_vec();
        body.push(0);
        body.extend_from_slice(&(data.len() as i32).to_be_bytes());
        body.extend_from_slice(data);
        let mut message = header(b'p', body.len() as i32 + 4);
        message.extend_from_slice(&body);
        message
    };
    let cases: [(Vec<u8>, &str); 5] = [
        (
            query("SELECT 1"),
            "expected password response, got message type 'Q'",
        ),
        (header(b'p', 0), "invalid message length 0"),
        (header(b'p', 16 * 1024 + 5), "over the limit of 16384 bytes"),
        (
            header(b'p', 4 + 3).into_iter().chain(*b"abc").collect(),
            "malformed SASL initial response",
        ),
        (
            sasl_initial("SCRAM-SHA-1", b"n,,n=app,r=abc"),
            "client selected an invalid SASL authentication mechanism",
        ),
    ];
    for (message, expect) in cases {
        let mut raw = Raw::connect(&addr(&SCRAM)).await;
        raw.send(&app_startup()).await;
        let (tag, mut body) = raw.recv().await.expect("AuthenticationSASL");
        assert_eq!((tag, body.get_i32()), (b'R', 10), "AuthenticationSASL");
        raw.send(&message).await;
        let text = raw.expect_fatal(PROTOCOL_VIOLATION).await;
        assert!(text.contains(expect), "want {expect:?} in {text:?}");
    }
    assert_unharmed(&SCRAM, &bystander).await;
}

#[tokio::test]
async fn wrong_password_and_unknown_user_fail_alike_with_scram() {
    assert_wrong_password_and_unknown_user_fail_alike(&SCRAM).await;
}

#[tokio::test]
async fn wrong_password_and_unknown_user_fail_alike_with_md5() {
    let md5 = start_fulcrum(&pg_primary().primary().addr(), "md5", "");
    assert_wrong_password_and_unknown_user_fail_alike(&md5).await;
}

#[tokio::test]
async fn unknown_database_gets_the_servers_3d000() {
    let bystander = bystander(&SCRAM).await;
    let error = login_error(&conn_string(
        &addr(&SCRAM),
        APP_USER,
        APP_PASSWORD,
        "no_such_db",
    ))
    .await;
    assert_eq!(
        error,
        (
            "3D000".to_owned(),
            "FATAL".to_owned(),
            "database \"no_such_db\" does not exist".to_owned()
        )
    );
    assert_unharmed(&SCRAM, &bystander).await;
}

/// 1,500 idle TCP connects held open (none sends a startup packet) do not
/// lock out a real client: they count against `max_pending_logins` (512 by
/// default), not `max_client_connections`, the oldest still logging in are
/// closed with 53300 to make room, and psql logs in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connects_does_not_lock_out_a_real_client() {
    fulcrum_testkit::raise_fd_limit();
    // Fewer client places than idle connects: connections still logging in
    // must not take them.
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "scram-sha-256",
        "max_client_connections = 1000\n",
    );
    let bystander = bystander(&fulcrum).await;
    let address = addr(&fulcrum);
    let mut idle = Vec::with_capacity(1500);
    for i in 0..1500 {
        let s = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(&address))
            .await
            .unwrap_or_else(|_| panic!("connect {i} hung"))
            .unwrap_or_else(|e| panic!("connect {i}: {e}"));
        idle.push(s);
    }
    // Idle for over a second: no longer a connection just made.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let started = Instant::now();
    let target = address.clone();
    let out = tokio::task::spawn_blocking(move || {
        fulcrum_testkit::run_psql(&target, APP_USER, APP_PASSWORD, APP_DB, "SELECT 42")
    })
    .await
    .unwrap();
    assert_eq!(out.expect("psql logs in"), "42");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "psql took {:?}",
        started.elapsed()
    );
    // The oldest idle connection was told why it was closed.
    let mut reply = Vec::new();
    tokio::time::timeout(IO_TIMEOUT, idle[0].read_to_end(&mut reply))
        .await
        .expect("the oldest idle connection was closed")
        .expect("read");
    assert_eq!(reply.first(), Some(&b'E'), "{reply:?}");
    let fields = error_fields(&reply[5..]);
    assert_eq!(
        fields.get(&'C').map(String::as_str),
        Some("53300"),
        "{fields:?}"
    );
    assert!(fields[&'M'].contains("max_pending_logins"), "{fields:?}");
    drop(idle);
    assert_unharmed(&fulcrum, &bystander).await;
}

/// `max_client_connections` counts logged-in clients: the next one gets
/// 53300 naming the key, and a place freed is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_over_max_client_connections_get_53300() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "scram-sha-256",
        "max_client_connections = 2\n",
    );
    let conn = conn_string(&addr(&fulcrum), APP_USER, APP_PASSWORD, APP_DB);
    let first = connect(&conn).await.expect("first");
    let second = connect(&conn).await.expect("second");
    let (code, severity, message) = login_error(&conn).await;
    assert_eq!((code.as_str(), severity.as_str()), ("53300", "FATAL"));
    assert!(message.contains("max_client_connections = 2"), "{message}");
    drop(first);
    let deadline = Instant::now() + IO_TIMEOUT;
    let third = loop {
        match connect(&conn).await {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the freed place was not given back: {e:?}"),
        }
    };
    assert_eq!(select_1(&third).await.unwrap(), 1);
    assert_eq!(select_1(&second).await.unwrap(), 1);
}

/// `client_login_timeout` ends a login that does not finish in time, with
/// FATAL 08P01 naming the key: here a client that sends half a startup
/// packet and stalls.
#[tokio::test]
async fn a_login_that_stalls_ends_at_client_login_timeout() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "trust",
        "client_login_timeout = \"1s\"\n",
    );
    let mut s = TcpStream::connect(addr(&fulcrum)).await.unwrap();
    s.write_all(&app_startup()[..6]).await.unwrap();
    let started = Instant::now();
    let mut reply = Vec::new();
    tokio::time::timeout(IO_TIMEOUT, s.read_to_end(&mut reply))
        .await
        .expect("closed")
        .expect("read");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(reply.first(), Some(&b'E'), "{reply:?}");
    let fields = error_fields(&reply[5..]);
    assert_eq!(
        fields.get(&'C').map(String::as_str),
        Some(PROTOCOL_VIOLATION)
    );
    assert!(fields[&'M'].contains("client_login_timeout"), "{fields:?}");
}

/// Stops a backend, so it runs on a cluster of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_down_at_connect_gets_08006_naming_it_and_recovers() {
    let cluster =
        tokio::task::block_in_place(|| PgCluster::builder().start()).expect("own test cluster");
    let primary = cluster.primary();
    let fulcrum = start_fulcrum(&primary.addr(), "scram-sha-256", "");
    let addr = addr(&fulcrum);
    let bystander = bystander(&fulcrum).await;
    let assert_backend_down = |(code, severity, message): (String, String, String)| {
        assert_eq!(
            (code.as_str(), severity.as_str()),
            ("08006", "FATAL"),
            "{message}"
        );
        assert!(
            message.contains(&primary.addr()),
            "the message should name {}: {message}",
            primary.addr()
        );
    };

    tokio::task::block_in_place(|| primary.stop_fast()).expect("stop the primary");
    // Startup parameters no client used before: only a server can accept
    // them, so the login itself must fail.
    let unseen = format!(
        "{} application_name=outage",
        conn_string(&addr, APP_USER, APP_PASSWORD, APP_DB)
    );
    assert_backend_down(login_error(&unseen).await);
    // The bystander's parameters: Fulcrum may log this client in from what the
    // server reported earlier (as PgBouncer does), and fail its first query instead.
    let seen = conn_string(&addr, APP_USER, APP_PASSWORD, APP_DB);
    let error = match connect(&seen).await {
        Err(e) => e,
        Ok(client) => select_1(&client)
            .await
            .expect_err("SELECT 1 with the primary down"),
    };
    assert_backend_down(db_error(&error));
    assert_eq!(
        fulcrum.try_wait(),
        None,
        "fulcrum exited:\n{}",
        fulcrum.log_contents()
    );

    tokio::task::block_in_place(|| primary.start()).expect("restart the primary");
    let deadline = Instant::now() + START_TIMEOUT;
    let client = loop {
        match connect(&unseen).await {
            Ok(client) => break client,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no connection after the primary came back: {e}"),
        }
    };
    assert_eq!(select_1(&client).await.expect("SELECT 1 after recovery"), 1);
    // Idle through the outage (so holding no server connection in transaction mode).
    assert_unharmed(&fulcrum, &bystander).await;
}
