//! Bad input on the MySQL listener gets a clear ERR packet with the right
//! code, and nothing else breaks: a client connected before keeps working and
//! the daemon stays up. Also LOAD DATA LOCAL INFILE, refused with an error.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{maria_connect, maria_one_replica};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_PASSWORD, APP_USER};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};

/// The binary's shared MariaDB primary and replica (`my_drivers` uses them
/// too), and this module's Fulcrum in front of them (with its port).
fn setup() -> (&'static MariaCluster, &'static FulcrumProcess, &'static u16) {
    static S: OnceLock<(FulcrumProcess, u16)> = OnceLock::new();
    let c = maria_one_replica();
    let (p, port) = S.get_or_init(|| {
        let port = free_port();
        let t = format!(
            "[fulcrum]\nlog = \"info\"\n\n[[cluster]]\nname = \"bad\"\nprotocol = \"mysql\"\n\
             listen = \"127.0.0.1:{port}\"\nmax_message_size = \"1MB\"\n\
             health_user = \"root\"\nhealth_password = \"\"\n\
             [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
             [[cluster.backend]]\naddress = \"{}\"\nrole = \"replica\"\n\
             [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
            c.primary().addr(),
            c.replicas()[0].addr()
        );
        let p = FulcrumProcess::start(&t).expect("fulcrum");
        (p, port)
    });
    (c, p, port)
}

/// Sends `bytes` after reading the server greeting; returns what comes back
/// until the connection closes or goes quiet.
fn raw_exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut greeting = [0u8; 512];
    let n = s.read(&mut greeting).unwrap();
    assert!(n > 4 && greeting[4] == 10, "protocol 10 handshake");
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// The error code of the first ERR packet in `bytes`.
fn err_code(bytes: &[u8]) -> Option<u16> {
    (bytes.len() > 7 && bytes[4] == 0xFF).then(|| u16::from_le_bytes([bytes[5], bytes[6]]))
}

async fn assert_unharmed(conn: &mut Conn) {
    let one: i64 = conn.query_first("SELECT 1").await.unwrap().unwrap();
    assert_eq!(one, 1, "a client connected before still works");
    assert_eq!(setup().1.try_wait(), None, "the daemon is still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_handshake_response_gets_err_1043() {
    let (_, _, port) = setup();
    let mut bystander = maria_connect(*port).await;
    // A packet of 5 bytes: far too short for a HandshakeResponse41.
    let reply = raw_exchange(*port, &[5, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0x00]);
    assert_eq!(err_code(&reply), Some(1043), "{reply:?}");
    assert_unharmed(&mut bystander).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_packet_gets_err_1153_from_its_header_alone() {
    let (_, _, port) = setup();
    let mut bystander = maria_connect(*port).await;
    // Declares 0xFFFFFF bytes (more to follow): over the limit, refused on
    // the header, before Fulcrum buffers any of it.
    let mut big = vec![0xFF, 0xFF, 0xFF, 1];
    big.extend(std::iter::repeat_n(0u8, 100));
    let reply = raw_exchange(*port, &big);
    assert_eq!(err_code(&reply), Some(1153), "{reply:?}");
    assert_unharmed(&mut bystander).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_and_unknown_users_get_the_same_err_1045() {
    let (_, _, port) = setup();
    let mut bystander = maria_connect(*port).await;
    for (user, pass) in [(APP_USER, "wrong"), ("nobody", APP_PASSWORD)] {
        let opts = OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(*port)
            .user(Some(user))
            .pass(Some(pass))
            .prefer_socket(false);
        let err = match Conn::new(opts).await {
            Ok(_) => panic!("{user} with {pass:?} was let in"),
            Err(e) => e,
        };
        match err {
            mysql_async::Error::Server(e) => {
                assert_eq!(e.code, 1045, "{e:?}");
                assert!(e.message.contains("Access denied"), "{e:?}");
            }
            other => panic!("expected ERR 1045, got {other:?}"),
        }
    }
    assert_unharmed(&mut bystander).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_pass_through_and_load_data_local_is_refused() {
    let (_, _, port) = setup();
    let mut conn = maria_connect(*port).await;
    let e = conn
        .query_drop("SELECT * FROM no_such_table")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, mysql_async::Error::Server(s) if s.code == 1146),
        "{e:?}"
    );
    let e = conn.query_drop("SELEKT 1").await.unwrap_err();
    assert!(
        matches!(&e, mysql_async::Error::Server(s) if s.code == 1064),
        "{e:?}"
    );
    let e = conn
        .query_drop("LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE t")
        .await
        .unwrap_err();
    match &e {
        mysql_async::Error::Server(s) => {
            assert!(
                s.message.to_lowercase().contains("local"),
                "clear message: {s:?}"
            )
        }
        other => panic!("expected an ERR, got {other:?}"),
    }
    assert_unharmed(&mut conn).await;
}

/// Idle TCP connects beyond `max_pending_logins` (512 by default) close the
/// oldest still logging in, with ERR 1040 naming the key, and a real
/// client logs in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connects_beyond_max_pending_logins_close_the_oldest() {
    fulcrum_testkit::raise_fd_limit();
    let (_, _, port) = setup();
    let mut bystander = maria_connect(*port).await;
    let mut idle = Vec::new();
    for _ in 0..600 {
        idle.push(TcpStream::connect(("127.0.0.1", *port)).expect("connect"));
    }
    // Idle for over a second: no longer connections just made.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let started = std::time::Instant::now();
    let mut conn = maria_connect(*port).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let one: i64 = conn.query_first("SELECT 1").await.unwrap().unwrap();
    assert_eq!(one, 1);
    let oldest = &mut idle[0];
    oldest
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut bytes = Vec::new();
    oldest
        .read_to_end(&mut bytes)
        .expect("the oldest idle connection was closed");
    // The greeting, then the error.
    let greeting = 4 + (u32::from_le_bytes([bytes[0], bytes[1], bytes[2], 0]) as usize);
    let rest = &bytes[greeting..];
    assert_eq!(err_code(rest), Some(1040), "{rest:?}");
    assert!(
        String::from_utf8_lossy(rest).contains("max_pending_logins"),
        "{rest:?}"
    );
    drop(idle);
    assert_unharmed(&mut bystander).await;
}

/// One client cannot grow Fulcrum without end by preparing: past
/// `max_client_prepared_statements` COM_STMT_PREPARE gets the server's own
/// ERR 1461, the session goes on, and a closed statement frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preparing_past_the_cap_gets_err_1461_and_the_session_goes_on() {
    let c = maria_one_replica();
    let port = free_port();
    let toml = fulcrum_suite::maria_toml(c, port, "max_client_prepared_statements = 3");
    let _p = FulcrumProcess::start(&toml).expect("fulcrum");
    let mut conn = maria_connect(port).await;
    let mut kept = Vec::new();
    for i in 0..3 {
        kept.push(
            conn.prep(format!("SELECT {i}"))
                .await
                .expect("within the cap"),
        );
    }
    let err = conn
        .prep("SELECT 'one too many'")
        .await
        .expect_err("over the cap");
    match err {
        mysql_async::Error::Server(e) => assert_eq!((e.code, e.state.as_str()), (1461, "42000")),
        e => panic!("expected ERR 1461, got {e}"),
    }
    let one: Option<u32> = conn.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1), "the session goes on");
    conn.close(kept.pop().unwrap()).await.unwrap();
    conn.prep("SELECT 'in the freed place'")
        .await
        .expect("a closed statement frees its place");
}
