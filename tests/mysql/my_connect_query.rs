//! `connect_query` on a MariaDB cluster: every new server connection runs
//! it before serving (a session variable it sets is there for the
//! client, and again after the client's COM_RESET_CONNECTION, which would
//! clear it); one that fails gives the client an error at once, logged
//! with the server's words.

use std::time::{Duration, Instant};

use fulcrum_suite::{maria_connect, maria_one_replica, maria_toml, try_maria_connect};
use fulcrum_testkit::{free_port, FulcrumProcess};
use mysql_async::prelude::Queryable;

fn fulcrum(extra: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let toml = maria_toml(maria_one_replica(), port, extra);
    let f = tokio::task::block_in_place(|| FulcrumProcess::start(&toml)).expect("start fulcrum");
    (f, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_query_sets_up_every_server_connection_even_after_a_reset() {
    // Session pooling: the client's reset reaches its server connection.
    let (f, port) = fulcrum("pool_mode = \"session\"\nconnect_query = \"SET @cq = 'ran'\"");
    let mut conn = maria_connect(port).await;
    // Reads (on the replica or the primary): the server connection ran it.
    for _ in 0..6 {
        let got: Option<Option<String>> = conn.query_first("SELECT @cq").await.expect("read");
        assert_eq!(got, Some(Some("ran".into())), "{}", f.log_contents());
    }
    conn.reset().await.expect("COM_RESET_CONNECTION");
    let got: Option<Option<String>> = conn.query_first("SELECT @cq").await.expect("after reset");
    assert_eq!(got, Some(Some("ran".into())), "run again after the reset");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_connect_query_is_an_error_at_once_not_a_hang() {
    let (f, port) = fulcrum(
        "pool_timeout = \"20s\"\nconnect_query = \"SELECT * FROM app.no_table_for_connect_query\"",
    );
    let started = Instant::now();
    let outcome = async {
        let mut conn = try_maria_connect(port).await?;
        conn.query_drop("SELECT 1").await
    }
    .await;
    let e = outcome.expect_err("no server connection can serve");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once: {:?}",
        started.elapsed()
    );
    let text = e.to_string();
    assert!(
        text.contains("connect_query failed") && text.contains("no_table_for_connect_query"),
        "{text}"
    );
    if let mysql_async::Error::Server(s) = &e {
        assert_eq!(s.code, 1043, "{s:?}");
    }
    f.wait_for_log("connect_query failed", Duration::from_secs(5))
        .expect("logged with the server's error");
}
