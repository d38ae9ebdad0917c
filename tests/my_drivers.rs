//! Application drivers through Fulcrum's MySQL listener, compared with the
//! same calls made directly to the MariaDB primary: PyMySQL, which does
//! not enable CLIENT_MULTI_STATEMENTS unless asked, and COM_SET_OPTION.
//!
//! Needs `PyMySQL` for the machine's `python3` (`.ci/run` installs it).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use fulcrum_suite::maria_toml;
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_DB, APP_PASSWORD, APP_USER};

fn setup() -> &'static (MariaCluster, FulcrumProcess, u16) {
    static S: OnceLock<(MariaCluster, FulcrumProcess, u16)> = OnceLock::new();
    S.get_or_init(|| {
        let c = MariaCluster::builder()
            .replicas(1)
            .start()
            .expect("MariaDB cluster");
        let port = free_port();
        let p = FulcrumProcess::start(&maria_toml(&c, port, "")).expect("fulcrum");
        (c, p, port)
    })
}

/// Runs a PyMySQL `script` against `host:port` (HOST, PORT, USER, PASSWORD,
/// DB in its environment); returns its standard output.
fn pymysql(host_port: &str, script: &str) -> String {
    let (host, port) = host_port.rsplit_once(':').expect("host:port");
    let mut child = Command::new("timeout")
        .args(["30", "python3", "-"])
        .env("HOST", host)
        .env("PORT", port)
        .env("USER", APP_USER)
        .env("PASSWORD", APP_PASSWORD)
        .env("DB", APP_DB)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let prelude = "import os, struct, pymysql\n\
        from pymysql.constants import CLIENT\n\
        def connect(**kw):\n    \
            return pymysql.connect(host=os.environ['HOST'], port=int(os.environ['PORT']), \
            user=os.environ['USER'], password=os.environ['PASSWORD'], database=os.environ['DB'], \
            connect_timeout=10, read_timeout=20, **kw)\n";
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{prelude}{script}").as_bytes())
        .expect("write script");
    let out = child.wait_with_output().expect("wait for python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'pymysql'"),
        "PyMySQL is not installed: pip install PyMySQL (.ci/run does)"
    );
    assert!(
        out.status.success(),
        "PyMySQL script failed ({})\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const MULTI_STATEMENTS: &str = r#"
def run(conn, sql):
    cur = conn.cursor()
    try:
        cur.execute(sql)
        sets = [cur.fetchall()]
        while cur.nextset():
            sets.append(cur.fetchall())
        print(repr(sql), "ok", sets)
    except pymysql.err.MySQLError as e:
        print(repr(sql), "error", e.args)

def set_option(conn, option):
    conn._execute_command(27, struct.pack('<H', option))  # COM_SET_OPTION
    print("set_option", option, conn._read_packet().is_eof_packet())

plain = connect()
for sql in ["SELECT 1", "SELECT 1;", "SELECT ';';", "SELECT 1 -- x; y\n",
            "SELECT 1; SELECT 2", "SELECT 1;\nSELECT 2, 3", "SELECT 'a;b'; SELECT 'c'"]:
    run(plain, sql)
set_option(plain, 0)
run(plain, "SELECT 1; SELECT 2")
set_option(plain, 1)
run(plain, "SELECT 1; SELECT 2")
multi = connect(client_flag=CLIENT.MULTI_STATEMENTS)
run(multi, "SELECT 1; SELECT 2")
"#;

#[test]
fn multi_statements_are_refused_unless_the_client_allows_them() {
    let (cluster, _fulcrum, port) = setup();
    let direct = pymysql(&cluster.primary().addr(), MULTI_STATEMENTS);
    let through = pymysql(&format!("127.0.0.1:{port}"), MULTI_STATEMENTS);
    // The refusal is the server's own error, so a client sees the same.
    assert!(
        direct.contains("'SELECT 1; SELECT 2' error (1064"),
        "the server refuses it: {direct}"
    );
    assert_eq!(through, direct, "through Fulcrum as directly");
}

async fn connect(port: u16, purpose: &str) -> mysql_async::Conn {
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port)
        .user(Some(APP_USER))
        .pass(Some(APP_PASSWORD))
        .db_name(Some(APP_DB))
        .prefer_socket(false);
    mysql_async::Conn::new(opts)
        .await
        .unwrap_or_else(|e| panic!("connect through fulcrum ({purpose}): {e}"))
}

#[tokio::test]
async fn a_multi_statement_setting_is_replayed_whole_on_other_connections() {
    use mysql_async::prelude::Queryable;
    let (_cluster, _fulcrum, port) = setup();
    let mut c = connect(*port, "settings").await;
    // Two settings in one COM_QUERY: run on the primary, then replayed on
    // the replica connection each read below uses. Every answer of the
    // replay must be read, or the next command gets a stale one.
    c.query_drop("SET SESSION sql_mode = 'ANSI_QUOTES'; SET time_zone = '+01:00'")
        .await
        .unwrap();
    for i in 0..5 {
        let row: (String, String, i64) = c
            .query_first(format!(
                "/* fulcrum:consistency=eventual */ SELECT @@session.sql_mode, @@session.time_zone, {i}"
            ))
            .await
            .unwrap()
            .expect("a row");
        assert_eq!(row, ("ANSI_QUOTES".into(), "+01:00".into(), i), "read {i}");
    }
    // A setting mixed with another statement is not replayed: the client
    // keeps its connection, and its reads still see the setting.
    let mut d = connect(*port, "mixed").await;
    d.query_drop("SET time_zone = '+02:00'; SELECT 1")
        .await
        .unwrap();
    for _ in 0..3 {
        let tz: String = d
            .query_first("SELECT @@session.time_zone")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tz, "+02:00");
    }
}
