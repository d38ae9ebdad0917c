//! Application drivers through Fulcrum's MySQL listener, compared with the
//! same calls made directly to the MariaDB primary: PyMySQL, which does
//! not enable CLIENT_MULTI_STATEMENTS unless asked, and COM_SET_OPTION.
//!
//! PyMySQL runs in the test kit's Python environment
//! (`fulcrum_testkit::python`, made on first use).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use fulcrum_suite::{maria_one_replica, maria_toml, try_maria_connect};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_DB, APP_PASSWORD, APP_USER};

/// The binary's shared MariaDB primary and replica (`my_bad_input` uses
/// them too), and this module's Fulcrum in front of them (with its port).
pub(crate) fn setup() -> (&'static MariaCluster, &'static FulcrumProcess, &'static u16) {
    static S: OnceLock<(FulcrumProcess, u16)> = OnceLock::new();
    let c = maria_one_replica();
    let (p, port) = S.get_or_init(|| {
        let port = free_port();
        let p = FulcrumProcess::start(&maria_toml(c, port, "")).expect("fulcrum");
        (p, port)
    });
    (c, p, port)
}

/// A second Fulcrum in front of the same servers, in session pooling: the
/// port of the one the tests comparing both pooling modes share.
pub(crate) fn session_pooled() -> u16 {
    static S: OnceLock<(FulcrumProcess, u16)> = OnceLock::new();
    let c = maria_one_replica();
    S.get_or_init(|| {
        let port = free_port();
        let toml = maria_toml(c, port, "pool_mode = \"session\"");
        (FulcrumProcess::start(&toml).expect("fulcrum"), port)
    })
    .1
}

/// Runs a PyMySQL `script` against `host:port` (HOST, PORT, USER, PASSWORD,
/// DB in its environment); returns its standard output.
pub(crate) fn pymysql(host_port: &str, script: &str) -> String {
    let (host, port) = host_port.rsplit_once(':').expect("host:port");
    let mut child = Command::new("timeout")
        .arg("30")
        .arg(fulcrum_testkit::python())
        .arg("-")
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
        "PyMySQL is missing from the test kit's Python environment (target/fulcrum-python): remove that directory to make it again"
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

/// A login through Fulcrum; `purpose` names it if it fails.
async fn connect(port: u16, purpose: &str) -> mysql_async::Conn {
    try_maria_connect(port)
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

/// A raw MySQL client: one packet at a time, for what no driver here sends
/// (a server-side cursor's COM_STMT_FETCH).
struct Raw {
    s: std::net::TcpStream,
}

impl Raw {
    /// Logs in as the app user with mysql_native_password.
    fn login(port: u16) -> Raw {
        use fulcrum_mysql::codec::handshake::{
            build_handshake_response, parse_server_handshake, HandshakeResponse,
        };
        use fulcrum_mysql::CapabilityFlags as C;
        let s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut raw = Raw { s };
        let (_, greeting) = raw.read();
        let hs = parse_server_handshake(&greeting).expect("greeting");
        let caps = C::CLIENT_PROTOCOL_41
            | C::CLIENT_SECURE_CONNECTION
            | C::CLIENT_LONG_PASSWORD
            | C::CLIENT_TRANSACTIONS;
        let reply = build_handshake_response(&HandshakeResponse {
            capabilities: caps,
            max_packet: 1 << 24,
            charset: 45,
            username: APP_USER.into(),
            auth_response: fulcrum_mysql::auth::native::client_response(
                APP_PASSWORD.as_bytes(),
                &hs.scramble,
            ),
            database: Some(APP_DB.into()),
            auth_plugin: Some("mysql_native_password".into()),
            connect_attrs: None,
            mariadb_capabilities: 0,
        });
        raw.write(1, &reply);
        let (_, ok) = raw.read();
        assert_eq!(ok[0], 0x00, "logged in: {ok:?}");
        raw
    }

    fn write(&mut self, seq: u8, payload: &[u8]) {
        use std::io::Write;
        let mut p = (payload.len() as u32).to_le_bytes()[..3].to_vec();
        p.push(seq);
        p.extend_from_slice(payload);
        self.s.write_all(&p).unwrap();
    }

    fn read(&mut self) -> (u8, Vec<u8>) {
        use std::io::Read;
        let mut h = [0u8; 4];
        self.s.read_exact(&mut h).expect("packet header");
        let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
        let mut p = vec![0u8; len];
        self.s.read_exact(&mut p).expect("packet payload");
        (h[3], p)
    }

    /// A command; returns every packet of its answer up to and including
    /// the first EOF/OK/ERR after `eofs_before` EOFs.
    fn command(&mut self, payload: &[u8], eofs_before: usize) -> Vec<Vec<u8>> {
        self.write(0, payload);
        let mut packets = Vec::new();
        let mut eofs = 0;
        loop {
            let (_, p) = self.read();
            let end = p[0] == 0xFF
                || (p[0] == 0x00 && packets.is_empty() && eofs_before == 0)
                || (p[0] == 0xFE && p.len() < 9);
            packets.push(p.clone());
            if end {
                if p[0] == 0xFE && eofs < eofs_before {
                    eofs += 1;
                    continue;
                }
                return packets;
            }
        }
    }
}

/// The status flags of an EOF packet.
fn eof_status(p: &[u8]) -> u16 {
    u16::from_le_bytes([p[3], p[4]])
}

#[test]
fn a_server_side_cursor_is_fetched_whole() {
    let (_cluster, _fulcrum, port) = setup();
    let mut raw = Raw::login(*port);
    let q = |sql: &str| [&[0x03u8][..], sql.as_bytes()].concat();
    for sql in [
        "CREATE TABLE IF NOT EXISTS drv_cursor (id INT PRIMARY KEY, v VARCHAR(10))",
        "DELETE FROM drv_cursor",
        "INSERT INTO drv_cursor VALUES (1,'a'),(2,'b'),(3,'c'),(4,'d'),(5,'e'),(6,'f'),(7,'g')",
    ] {
        let answer = raw.command(&q(sql), 0);
        assert_eq!(answer.last().unwrap()[0], 0x00, "{sql}: {answer:?}");
    }
    // COM_STMT_PREPARE: PREPARE_OK, 2 column definitions, EOF.
    let prepared = raw.command(
        &[&[0x16u8][..], b"SELECT id, v FROM drv_cursor ORDER BY id"].concat(),
        0,
    );
    assert_eq!(prepared[0][0], 0x00, "{prepared:?}");
    let id = [
        prepared[0][1],
        prepared[0][2],
        prepared[0][3],
        prepared[0][4],
    ];
    if prepared.len() == 1 {
        // The definitions follow the PREPARE_OK.
        for _ in 0..3 {
            raw.read();
        }
    }
    // COM_STMT_EXECUTE with CURSOR_TYPE_READ_ONLY: column count, 2
    // definitions, an EOF saying a cursor exists; no rows yet.
    let execute = [&[0x17u8][..], &id, &[0x01], &1u32.to_le_bytes()].concat();
    let opened = raw.command(&execute, 0);
    let last = opened.last().unwrap();
    assert_eq!(last[0], 0xFE, "{opened:?}");
    assert!(
        eof_status(last) & 0x0040 != 0,
        "SERVER_STATUS_CURSOR_EXISTS"
    );
    // COM_STMT_FETCH 2 rows at a time: binary rows (each begins 0x00) then
    // an EOF; the last says LAST_ROW_SENT.
    let mut ids = Vec::new();
    for _ in 0..10 {
        let fetch = [&[0x1Cu8][..], &id, &2u32.to_le_bytes()].concat();
        raw.write(0, &fetch);
        loop {
            let (_, p) = raw.read();
            match p[0] {
                0x00 => ids.push(i32::from_le_bytes([p[2], p[3], p[4], p[5]])),
                0xFE => {
                    if eof_status(&p) & 0x0080 != 0 {
                        assert_eq!(ids, (1..=7).collect::<Vec<_>>());
                        // The session goes on.
                        let answer = raw.command(&q("SELECT 42"), 1);
                        assert_eq!(answer.last().unwrap()[0], 0xFE, "{answer:?}");
                        return;
                    }
                    break;
                }
                other => panic!("unexpected packet {other:#x}: {p:?}"),
            }
        }
    }
    panic!("no LAST_ROW_SENT after 10 fetches: {ids:?}");
}

const STORED_PROGRAMS: &str = r#"
def run(conn, sql):
    cur = conn.cursor()
    try:
        cur.execute(sql)
        sets = [cur.fetchall()]
        while cur.nextset():
            sets.append(cur.fetchall())
        print(repr(sql[:40]), "ok", sets)
    except pymysql.err.MySQLError as e:
        print(repr(sql[:40]), "error", e.args[0])

c = connect()
for sql in [
    "DROP PROCEDURE IF EXISTS fulcrum_two",
    "CREATE PROCEDURE fulcrum_two() BEGIN SELECT 1; SELECT 2; END",
    "CALL fulcrum_two()",
    "DROP FUNCTION IF EXISTS fulcrum_f",
    "CREATE FUNCTION fulcrum_f(x INT) RETURNS INT DETERMINISTIC BEGIN DECLARE y INT; SET y = x * 2; IF y > 2 THEN SET y = y + 1; END IF; RETURN y; END",
    "SELECT fulcrum_f(1), fulcrum_f(2)",
    "BEGIN NOT ATOMIC DECLARE z INT DEFAULT 3; SELECT z; END",
    "IF 1 = 1 THEN SELECT 'yes'; ELSE SELECT 'no'; END IF",
    "CREATE PROCEDURE fulcrum_two() BEGIN SELECT 1; END; SELECT 2",
    "DROP PROCEDURE fulcrum_two",
    "DROP FUNCTION fulcrum_f",
]:
    run(c, sql)
"#;

/// A stored program's body holds `;` of its own: a client without
/// CLIENT_MULTI_STATEMENTS (PyMySQL's default, and Connector/J's, so
/// Flyway's and Liquibase's) creates procedures and functions, and runs
/// MariaDB's compound statements, through Fulcrum as directly; a statement
/// stacked after one is still refused with the server's 1064.
#[test]
fn stored_programs_are_created_as_directly() {
    let (cluster, _fulcrum, port) = setup();
    let direct = pymysql(&cluster.primary().addr(), STORED_PROGRAMS);
    let through = pymysql(&format!("127.0.0.1:{port}"), STORED_PROGRAMS);
    assert!(
        direct.contains("'CALL fulcrum_two()' ok [((1,),), ((2,),)"),
        "{direct}"
    );
    assert!(direct.contains("error 1064"), "the stacked one: {direct}");
    assert_eq!(through, direct, "through Fulcrum as directly");
}

const WAIT_TIMEOUT: &str = r#"
import time
c = connect()
c.cursor().execute("SET wait_timeout = 1")
time.sleep(2.5)
try:
    c.cursor().execute("SELECT 1")
    print("still open")
except pymysql.err.OperationalError as e:
    print("closed", e.args[0])
"#;

/// A client's own `SET wait_timeout = 1`, then idle: directly the server
/// resets the connection and PyMySQL reports it lost (2006 here, as its
/// next write meets the reset; 2013 when a read does); through Fulcrum the
/// same, in transaction and in session pooling (not an ERR 1927 from a
/// server connection the server closed).
#[test]
fn a_clients_own_wait_timeout_closes_it_as_the_server_would() {
    let (cluster, _fulcrum, port) = setup();
    let direct = pymysql(&cluster.primary().addr(), WAIT_TIMEOUT);
    assert!(
        direct == "closed 2006\n" || direct == "closed 2013\n",
        "{direct}"
    );
    let through = pymysql(&format!("127.0.0.1:{port}"), WAIT_TIMEOUT);
    assert_eq!(through, direct, "transaction pooling");
    let through = pymysql(&format!("127.0.0.1:{}", session_pooled()), WAIT_TIMEOUT);
    assert_eq!(through, direct, "session pooling");
}

/// mysql_async's everyday calls for the same: a procedure created and
/// called (its text protocol, CLIENT_MULTI_STATEMENTS on), and its own
/// `SET wait_timeout` honoured (the next query after the idle time fails
/// with the same kind of error as directly), through Fulcrum as directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_async_stored_programs_and_wait_timeout_as_directly() {
    use mysql_async::prelude::Queryable;
    let (cluster, _fulcrum, port) = setup();
    let server_port: u16 = cluster
        .primary()
        .addr()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let mut outcomes = Vec::new();
    for port in [server_port, *port] {
        let mut c = fulcrum_suite::maria_connect(port).await;
        c.query_drop("DROP PROCEDURE IF EXISTS fulcrum_async_two")
            .await
            .unwrap();
        c.query_drop("CREATE PROCEDURE fulcrum_async_two() BEGIN SELECT 1; SELECT 2; END")
            .await
            .unwrap();
        let mut result = c.query_iter("CALL fulcrum_async_two()").await.unwrap();
        let mut sets = Vec::new();
        while !result.is_empty() {
            let rows: Vec<i64> = result.collect().await.unwrap();
            sets.push(rows);
        }
        drop(result);
        c.query_drop("DROP PROCEDURE fulcrum_async_two")
            .await
            .unwrap();
        c.query_drop("SET wait_timeout = 1").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        let after = match c.query_drop("SELECT 1").await {
            Ok(()) => "still open".to_owned(),
            Err(mysql_async::Error::Io(_)) => "closed (io)".to_owned(),
            Err(mysql_async::Error::Driver(_)) => "closed (driver)".to_owned(),
            Err(e) => format!("other: {e}"),
        };
        outcomes.push((sets, after));
    }
    assert_eq!(outcomes[0].0, vec![vec![1], vec![2]], "directly");
    assert!(outcomes[0].1.starts_with("closed"), "{:?}", outcomes[0]);
    assert_eq!(outcomes[1], outcomes[0], "through Fulcrum as directly");
}
