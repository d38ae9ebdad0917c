//! What a MySQL client is told when Fulcrum cannot give it a server
//! connection, through a real Fulcrum in front of MariaDB: a login the
//! server denies (a listed user whose password the server does not take,
//! one the server does not know) reaches the client as the server's ERR
//! 1045, in its words, said to be the server's refusal of that user; ERR
//! 1040 comes only from a pool with nothing to give within `pool_timeout`,
//! and says so.

use std::sync::Once;
use std::time::Duration;

use fulcrum_suite::{maria_connect, maria_one_replica, maria_opts, maria_toml};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};
use mysql_async::prelude::Queryable;

/// The shared cluster, with a server user whose password is not the
/// config's.
fn cluster() -> &'static MariaCluster {
    static USER: Once = Once::new();
    let c = maria_one_replica();
    USER.call_once(|| {
        c.primary()
            .sql(
                "CREATE USER IF NOT EXISTS 'refused_pw'@'%' IDENTIFIED BY 'only-the-server-knows'; \
                 GRANT ALL ON app.* TO 'refused_pw'@'%'",
            )
            .expect("user");
    });
    c
}

fn fulcrum(extra: &str, users: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let toml = format!("{}{users}", maria_toml(cluster(), port, extra));
    let f = tokio::task::block_in_place(|| FulcrumProcess::start(&toml)).expect("start fulcrum");
    (f, port)
}

/// The server error `user` (with `password`) gets logging in through
/// `port` and running a statement on the primary.
async fn first_error(port: u16, user: &str, password: &str) -> mysql_async::ServerError {
    let opts = maria_opts(port).user(Some(user)).pass(Some(password));
    let outcome = async {
        let mut conn = mysql_async::Conn::new(opts).await?;
        conn.query_drop("/* fulcrum:primary */ SELECT 1").await
    }
    .await;
    match outcome {
        Err(mysql_async::Error::Server(e)) => e,
        other => panic!("{user}: a server error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_the_server_denies_reaches_the_client_as_its_1045() {
    let (f, port) = fulcrum(
        "",
        "[[cluster.user]]\nname = \"refused_pw\"\npassword = \"fulcrum-pw\"\n\
         [[cluster.user]]\nname = \"no_such_user\"\npassword = \"fulcrum-pw\"\n",
    );
    let server = cluster().primary().addr();
    for user in ["refused_pw", "no_such_user"] {
        let e = first_error(port, user, "fulcrum-pw").await;
        let log = f.log_contents();
        assert_eq!(
            (e.code, e.state.as_str()),
            (1045, "28000"),
            "{user}: {e:?}\n{log}"
        );
        assert!(
            e.message.starts_with(&format!(
                "fulcrum: the server {server} refused the login of user '{user}': "
            )) && e
                .message
                .contains(&format!("Access denied for user '{user}'@")),
            "{user}: the server's refusal, in its words: {e:?}\n{log}"
        );
        assert!(!e.message.contains("Too many connections"), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn err_1040_says_the_pool_had_no_connection_within_pool_timeout() {
    let (f, port) = fulcrum("pool_size = 1\npool_timeout = \"500ms\"", "");
    // The pool's one connection to the primary, held by a transaction.
    let mut holder = maria_connect(port).await;
    holder.query_drop("BEGIN").await.unwrap();
    holder
        .query_drop("/* fulcrum:primary */ SELECT 1")
        .await
        .unwrap();
    let e = first_error(
        port,
        fulcrum_testkit::APP_USER,
        fulcrum_testkit::APP_PASSWORD,
    )
    .await;
    assert_eq!(e.code, 1040, "{e:?}\n{}", f.log_contents());
    assert!(
        e.message.contains(&format!(
            "no server connection for user '{}' on {}: pool_timeout ({:?}) ran out",
            fulcrum_testkit::APP_USER,
            cluster().primary().addr(),
            Duration::from_millis(500)
        )) && e
            .message
            .contains("all 1 of the pool's connections are in use"),
        "{e:?}"
    );
    holder.query_drop("COMMIT").await.unwrap();
}
