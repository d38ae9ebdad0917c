//! Several clusters on one port, the client's database picking the cluster
//! (PgBouncer's `[databases]`, PgDog's `[[databases]]`): two real
//! PostgreSQL clusters behind one Fulcrum port, each reached by its own
//! database names (one an alias), cancel requests reaching the cluster that
//! runs the query, and an unknown database refused; on MariaDB, two clusters
//! on one port with their own users.

use std::time::{Duration, Instant};

use fulcrum_suite::{first_value, pg_conn_string, pg_connect_str};
use fulcrum_testkit::{
    free_port, FulcrumProcess, MariaCluster, PgCluster, APP_DB, APP_PASSWORD, APP_USER,
};
use tokio_postgres::{Client, NoTls};

fn pg_cluster_section(name: &str, listen: &str, primary: &str, databases: &str) -> String {
    format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"postgres\"\nlisten = \"{listen}\"\n\
         health_interval = \"500ms\"\n\n[[cluster.backend]]\naddress = \"{primary}\"\nrole = \"primary\"\n\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n\n{databases}\n"
    )
}

/// A login to `db` through the shared port.
async fn connect(port: u16, db: &str) -> Result<Client, tokio_postgres::Error> {
    pg_connect_str(&pg_conn_string(&format!("127.0.0.1:{port}"), APP_USER, db)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_clusters_share_one_port_by_database() {
    let (east, west) = tokio::task::block_in_place(|| {
        (
            PgCluster::builder().start().expect("first cluster"),
            PgCluster::builder().start().expect("second cluster"),
        )
    });
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let toml = format!(
        "[fulcrum]\nlog = \"info\"\n\n{}{}",
        pg_cluster_section(
            "east",
            &listen,
            &east.primary().addr(),
            &format!("[[cluster.database]]\nname = \"{APP_DB}\"\n")
        ),
        pg_cluster_section(
            "west",
            &listen,
            &west.primary().addr(),
            &format!("[[cluster.database]]\nname = \"reports\"\nserver_database = \"{APP_DB}\"\n")
        ),
    );
    let _fulcrum = FulcrumProcess::start(&toml).expect("fulcrum starts");

    let e = connect(port, APP_DB).await.expect("east by its database");
    let w = connect(port, "reports").await.expect("west by its alias");
    let server_port = "SELECT inet_server_port()";
    assert_eq!(
        first_value(&e, server_port).await,
        east.primary().port().to_string()
    );
    assert_eq!(
        first_value(&w, server_port).await,
        west.primary().port().to_string()
    );
    assert_eq!(first_value(&w, "SELECT current_database()").await, APP_DB);
    // Writes land on their own cluster only.
    w.batch_execute("CREATE TABLE only_west (v int); INSERT INTO only_west VALUES (7)")
        .await
        .unwrap();
    assert_eq!(first_value(&w, "SELECT v FROM only_west").await, "7");
    let missing = e.simple_query("SELECT v FROM only_west").await.unwrap_err();
    assert_eq!(
        missing.as_db_error().map(|d| d.code().code()),
        Some("42P01"),
        "{missing:?}"
    );

    // A cancel request carries no database: it still reaches the cluster
    // running the query.
    let token = w.cancel_token();
    let started = Instant::now();
    let sleeping = tokio::spawn(async move { w.simple_query("SELECT pg_sleep(20)").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(NoTls).await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_secs(10), sleeping)
        .await
        .expect("cancelled in time")
        .unwrap()
        .unwrap_err();
    assert_eq!(
        cancelled.as_db_error().map(|d| d.code().code()),
        Some("57014"),
        "{cancelled:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // Neither cluster lists it, and neither takes the rest: the first
    // cluster refuses it, after the password, as PostgreSQL would.
    let Err(refused) = connect(port, "nosuch").await else {
        panic!("an unknown database is refused");
    };
    let db = refused.as_db_error().expect("an ErrorResponse");
    assert_eq!(db.code().code(), "3D000", "{db:?}");
    // The first cluster still serves.
    assert_eq!(first_value(&e, "SELECT 1").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mariadb_clusters_share_one_port_by_schema() {
    use mysql_async::prelude::Queryable;
    let maria = tokio::task::block_in_place(|| MariaCluster::builder().start().expect("MariaDB"));
    let port = free_port();
    let section = |name: &str, password: &str, databases: &str| {
        format!(
            "[[cluster]]\nname = \"{name}\"\nprotocol = \"mysql\"\nlisten = \"127.0.0.1:{port}\"\n\
             client_auth = \"mysql_native_password\"\nhealth_user = \"root\"\nhealth_password = \"\"\n\n\
             [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\n\
             [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{password}\"\nserver_user = \"{APP_USER}\"\nserver_password = \"{APP_PASSWORD}\"\n\n{databases}\n",
            maria.primary().addr()
        )
    };
    let toml = format!(
        "[fulcrum]\nlog = \"info\"\n\n{}{}",
        section(
            "shop",
            APP_PASSWORD,
            "[[cluster.database]]\nname = \"app\"\n"
        ),
        section(
            "office",
            "office-secret",
            "[[cluster.database]]\nname = \"office\"\nserver_database = \"app\"\n"
        ),
    );
    let _fulcrum = FulcrumProcess::start(&toml).expect("fulcrum starts");
    let opts = |db: &str, password: &str| {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(port)
            .user(Some(APP_USER))
            .pass(Some(password.to_owned()))
            .db_name(Some(db.to_owned()))
            .prefer_socket(false)
    };
    let mut shop = mysql_async::Conn::new(opts("app", APP_PASSWORD))
        .await
        .expect("shop with its password");
    let mut office = mysql_async::Conn::new(opts("office", "office-secret"))
        .await
        .expect("office with its own password");
    let schema: Option<String> = office.query_first("SELECT DATABASE()").await.unwrap();
    assert_eq!(
        schema.as_deref(),
        Some("app"),
        "the alias reaches the server's schema"
    );
    let one: Option<i64> = shop.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    // Each cluster checks its own users: the other cluster's password fails.
    let Err(wrong) = mysql_async::Conn::new(opts("office", APP_PASSWORD)).await else {
        panic!("the other cluster's password is refused");
    };
    assert!(wrong.to_string().contains("1045"), "{wrong}");
    let Err(unknown) = mysql_async::Conn::new(opts("nosuch", APP_PASSWORD)).await else {
        panic!("an unknown schema is refused");
    };
    assert!(unknown.to_string().contains("1049"), "{unknown}");
    drop(shop);
    drop(office);
}
