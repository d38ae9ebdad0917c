//! The connection id a client was given at login is the one every answer
//! shows it, in both pooling modes: `CONNECTION_ID()` (alone and within a
//! statement), the process list's `Id` column (`SHOW PROCESSLIST`,
//! `information_schema.PROCESSLIST`), and `KILL <id>` from another client
//! ends it, as PyMySQL's own test_issue_36 does directly.

use mysql_async::prelude::Queryable;

use crate::my_drivers::{pymysql, session_pooled, setup};

/// What a client is told of its own id, asked four ways.
async fn ids_seen(port: u16) -> (u32, Vec<u64>) {
    let mut c = fulcrum_suite::maria_connect(port).await;
    let id = c.id();
    let alone: u64 = c
        .query_first("SELECT CONNECTION_ID()")
        .await
        .unwrap()
        .unwrap();
    let within: u64 = c
        .query_first("SELECT CONNECTION_ID() + 0 FROM DUAL")
        .await
        .unwrap()
        .unwrap();
    let processlist: Vec<(u64, Option<String>)> = c
        .query("SELECT ID, INFO FROM information_schema.PROCESSLIST")
        .await
        .unwrap();
    let listed = processlist
        .iter()
        .find(|(_, info)| info.as_deref().is_some_and(|i| i.contains("PROCESSLIST")))
        .map_or(0, |r| r.0);
    let show: Vec<mysql_async::Row> = c.query("SHOW PROCESSLIST").await.unwrap();
    let shown = show
        .iter()
        .find(|r| r.get::<Option<String>, _>(7).flatten().as_deref() == Some("SHOW PROCESSLIST"))
        .and_then(|r| r.get::<u64, _>(0))
        .unwrap_or(0);
    c.disconnect().await.unwrap();
    (id, vec![alone, within, listed, shown])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_id_is_the_id_every_answer_shows() {
    let (_, _fulcrum, &port) = setup();
    let session_port = session_pooled();
    for (mode, port) in [("transaction", port), ("session", session_port)] {
        let (id, seen) = ids_seen(port).await;
        assert!(id >= 1 << 30, "{mode}: Fulcrum's ids start high ({id})");
        assert_eq!(
            seen,
            vec![u64::from(id); 4],
            "{mode}: CONNECTION_ID(), within a statement, information_schema, SHOW"
        );
    }
}

/// PyMySQL's test_issue_36: a client finds its own id in the process list,
/// another client kills it, its next statement fails, and its id leaves the
/// process list.
const ISSUE_36: &str = r#"
import time
killer, victim = connect(), connect()
c = victim.cursor()
c.execute("show processlist")
kill_id = next((row[0] for row in c.fetchall() if row[7] == "show processlist"), None)
print("listed", kill_id == victim.thread_id())
killer.kill(kill_id)
try:
    c.execute("show tables")
    print("broken", False)
except Exception:
    print("broken", True)
time.sleep(0.1)
k = killer.cursor()
k.execute("show processlist")
print("gone", kill_id not in [row[0] for row in k.fetchall()])
k.execute("SELECT 1")
print("killer works", k.fetchall() == ((1,),))
"#;

#[test]
fn another_client_kills_a_client_by_its_login_id() {
    let (cluster, _fulcrum, &port) = setup();
    let session_port = session_pooled();
    let expected = "listed True\nbroken True\ngone True\nkiller works True\n";
    let direct = pymysql(&cluster.primary().addr(), ISSUE_36);
    assert_eq!(direct, expected, "directly");
    for port in [port, session_port] {
        let through = pymysql(&format!("127.0.0.1:{port}"), ISSUE_36);
        assert_eq!(through, expected, "through Fulcrum (port {port})");
    }
}
