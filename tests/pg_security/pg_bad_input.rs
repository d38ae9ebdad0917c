//! Bad input at Fulcrum's PostgreSQL front end, sent to the real daemon in front
//! of a real PostgreSQL: each case checks the exact reply (FATAL and SQLSTATE,
//! or a silent close) and that the daemon and a client connected before the bad
//! input are unharmed.
//!
//! Raw-byte cases use a `client_auth = "trust"` listener, so a raw login is a
//! StartupMessage and reading up to ReadyForQuery. Needs `cargo build -p fulcrum`.
//! The small raw-protocol client (`Raw`) is local to this file; it belongs in
//! fulcrum-testkit once a second test needs it.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use fulcrum_suite::{pg_connect_str, pg_primary, startup_message, PROTOCOL_3_0};
use fulcrum_testkit::{
    free_port, FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER, START_TIMEOUT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::Client;

/// Longest any single network step may take before the test fails.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;

const PROTOCOL_VIOLATION: &str = "08P01";

/// SCRAM client auth, defaults otherwise: for the tokio-postgres cases.
static SCRAM: LazyLock<FulcrumProcess> =
    LazyLock::new(|| start_fulcrum(&pg_primary().primary().addr(), "scram-sha-256", ""));

/// Trust client auth and a 1 kB message limit: for the raw-byte cases.
static TRUST: LazyLock<FulcrumProcess> = LazyLock::new(|| {
    start_fulcrum(
        &pg_primary().primary().addr(),
        "trust",
        "max_message_size = \"1kB\"\n",
    )
});

/// Starts Fulcrum on a free port in front of `backend`, retrying if another
/// process took the port first.
fn start_fulcrum(backend: &str, client_auth: &str, extra: &str) -> FulcrumProcess {
    let mut last_error = None;
    for _ in 0..3 {
        let config = format!(
            "[fulcrum]\n\
             log = \"info\"\n\
             [[cluster]]\n\
             name = \"bad-input\"\n\
             protocol = \"postgres\"\n\
             listen = \"127.0.0.1:{port}\"\n\
             client_auth = \"{client_auth}\"\n\
             {extra}\
             [[cluster.backend]]\n\
             address = \"{backend}\"\n\
             role = \"primary\"\n\
             [[cluster.user]]\n\
             name = \"{APP_USER}\"\n\
             password = \"{APP_PASSWORD}\"\n",
            port = free_port()
        );
        match FulcrumProcess::start(&config) {
            Ok(p) => return p,
            Err(e) => last_error = Some(e),
        }
    }
    panic!("fulcrum did not start: {}", last_error.expect("an error"));
}

fn addr(fulcrum: &FulcrumProcess) -> String {
    fulcrum.listen_addrs()[0].clone()
}

fn conn_string(addr: &str, user: &str, password: &str, db: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
    format!(
        "host={host} port={port} user={user} password={password} dbname={db} connect_timeout=10"
    )
}

// ---- tokio-postgres clients ----------------------------------------------------

/// A login (`fulcrum_suite::pg_connect_str`) that must be over within
/// `IO_TIMEOUT`.
async fn connect(conn_string: &str) -> Result<Client, tokio_postgres::Error> {
    tokio::time::timeout(IO_TIMEOUT, pg_connect_str(conn_string))
        .await
        .unwrap_or_else(|_| panic!("login hung: {conn_string}"))
}

/// The SQLSTATE, severity and message of a server error.
fn db_error(err: &tokio_postgres::Error) -> (String, String, String) {
    let db_error = err
        .as_db_error()
        .unwrap_or_else(|| panic!("expected an ErrorResponse, got {err:?}"));
    (
        db_error.code().code().to_owned(),
        db_error.severity().to_owned(),
        db_error.message().to_owned(),
    )
}

/// The SQLSTATE, severity and message of a refused login.
async fn login_error(conn_string: &str) -> (String, String, String) {
    match connect(conn_string).await {
        Ok(_) => panic!("login succeeded: {conn_string}"),
        Err(e) => db_error(&e),
    }
}

async fn select_1(client: &Client) -> Result<i32, tokio_postgres::Error> {
    let row = tokio::time::timeout(IO_TIMEOUT, client.query_one("SELECT 1", &[]))
        .await
        .expect("SELECT 1 hung")?;
    Ok(row.get(0))
}

/// A client connected (and checked) before the bad input is sent.
async fn bystander(fulcrum: &FulcrumProcess) -> Client {
    let client = connect(&conn_string(&addr(fulcrum), APP_USER, APP_PASSWORD, APP_DB))
        .await
        .expect("bystander login");
    assert_eq!(select_1(&client).await.expect("bystander SELECT 1"), 1);
    client
}

/// The daemon is still running, did not panic, and still serves `bystander`.
async fn assert_unharmed(fulcrum: &FulcrumProcess, bystander: &Client) {
    assert_eq!(
        fulcrum.try_wait(),
        None,
        "fulcrum exited:\n{}",
        fulcrum.log_contents()
    );
    assert!(
        !fulcrum.log_contents().contains("panicked"),
        "fulcrum panicked:\n{}",
        fulcrum.log_contents()
    );
    match select_1(bystander).await {
        Ok(1) => {}
        other => panic!("bystander broken after the bad input: {other:?}"),
    }
}

// ---- raw protocol ------------------------------------------------------------------

fn app_startup() -> Vec<u8> {
    startup_message(PROTOCOL_3_0, &[("user", APP_USER), ("database", APP_DB)])
}

fn cancel_request(process_id: i32, secret_key: i32) -> Vec<u8> {
    let mut packet = 16i32.to_be_bytes().to_vec();
    packet.extend_from_slice(&CANCEL_REQUEST.to_be_bytes());
    packet.extend_from_slice(&process_id.to_be_bytes());
    packet.extend_from_slice(&secret_key.to_be_bytes());
    packet
}

/// SQL whose Query message declares exactly `len` bytes (a body of `len - 4`);
/// the query returns one text column of `len - 15` characters.
fn sql_of_length(len: usize) -> String {
    let filler = len - 4 - "SELECT '';".len() - 1;
    let sql = format!("SELECT '{}';", "x".repeat(filler));
    assert_eq!(query(&sql).len(), 1 + len);
    sql
}

fn query(sql: &str) -> Vec<u8> {
    let mut message = vec![b'Q'];
    message.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    message.extend_from_slice(sql.as_bytes());
    message.push(0);
    message
}

/// A message header only: a tag and a declared length.
fn header(tag: u8, len: i32) -> Vec<u8> {
    let mut message = vec![tag];
    message.extend_from_slice(&len.to_be_bytes());
    message
}

/// The fields of an ErrorResponse body, by field type.
fn error_fields(mut body: &[u8]) -> HashMap<char, String> {
    let mut fields = HashMap::new();
    while let Some((&kind, rest)) = body.split_first() {
        if kind == 0 {
            break;
        }
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .expect("NUL-terminated field");
        fields.insert(
            kind as char,
            String::from_utf8_lossy(&rest[..end]).into_owned(),
        );
        body = &rest[end + 1..];
    }
    fields
}

/// A client connection speaking raw protocol bytes.
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
}

/// What BackendKeyData gave a raw login.
#[derive(Debug, Clone, Copy)]
struct CancelKey {
    process_id: i32,
    secret_key: i32,
}

impl Raw {
    async fn connect(addr: &str) -> Raw {
        let stream = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("TCP connect hung")
            .unwrap_or_else(|e| panic!("TCP connect to {addr}: {e}"));
        Raw {
            stream,
            buf: BytesMut::new(),
        }
    }

    /// Logs in as `app` on a trust listener; returns the cancel key.
    async fn login(addr: &str) -> (Raw, CancelKey) {
        let mut raw = Raw::connect(addr).await;
        raw.send(&app_startup()).await;
        let key = raw.finish_login().await;
        (raw, key)
    }

    /// Reads AuthenticationOk .. ReadyForQuery after a StartupMessage.
    async fn finish_login(&mut self) -> CancelKey {
        let (tag, body) = self.recv().await.expect("a reply to the startup message");
        assert_eq!(
            (tag, &body[..]),
            (b'R', &0i32.to_be_bytes()[..]),
            "AuthenticationOk"
        );
        let mut key = None;
        loop {
            match self.recv().await.expect("login messages") {
                (b'S', _) => {}
                (b'K', mut body) => {
                    key = Some(CancelKey {
                        process_id: body.get_i32(),
                        secret_key: body.get_i32(),
                    })
                }
                (b'Z', _) => return key.expect("BackendKeyData before ReadyForQuery"),
                (tag, body) => panic!("unexpected {:?} during login: {body:?}", tag as char),
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(IO_TIMEOUT, self.stream.write_all(bytes))
            .await
            .expect("write hung")
            .expect("write");
    }

    /// The next whole message, or `None` once the server has closed the
    /// connection (a reset counts as closed: Fulcrum may close with our
    /// bytes unread).
    async fn recv(&mut self) -> Option<(u8, Bytes)> {
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
                let total = 1 + usize::try_from(len).expect("server sent a negative length");
                if self.buf.len() >= total {
                    let mut message = self.buf.split_to(total).freeze();
                    let tag = message[0];
                    message.advance(5);
                    return Some((tag, message));
                }
            }
            let read = tokio::time::timeout(IO_TIMEOUT, self.stream.read_buf(&mut self.buf))
                .await
                .expect("no reply and no close from fulcrum");
            match read {
                Ok(0) | Err(_) if self.buf.is_empty() => return None,
                Ok(0) | Err(_) => panic!("connection closed mid-message: {:?}", self.buf),
                Ok(_) => {}
            }
        }
    }

    /// Asserts that the server closes the connection without sending anything.
    async fn expect_closed(&mut self) {
        if let Some((tag, body)) = self.recv().await {
            panic!(
                "expected the connection closed, got {:?} {body:?}",
                tag as char
            );
        }
    }

    /// Asserts a FATAL ErrorResponse with `code`, then the close; returns its message.
    async fn expect_fatal(&mut self, code: &str) -> String {
        let (tag, body) = self.recv().await.expect("an ErrorResponse, got a close");
        assert_eq!(
            tag, b'E',
            "expected ErrorResponse, got {:?} {body:?}",
            tag as char
        );
        let fields = error_fields(&body);
        assert_eq!(
            fields.get(&'S').map(String::as_str),
            Some("FATAL"),
            "{fields:?}"
        );
        assert_eq!(
            fields.get(&'C').map(String::as_str),
            Some(code),
            "{fields:?}"
        );
        self.expect_closed().await;
        fields.get(&'M').cloned().expect("message field")
    }

    /// Sends a simple query and collects the reply up to ReadyForQuery.
    async fn query(&mut self, sql: &str) -> Vec<(u8, Bytes)> {
        self.send(&query(sql)).await;
        self.read_until_ready().await
    }

    async fn read_until_ready(&mut self) -> Vec<(u8, Bytes)> {
        let mut reply = Vec::new();
        loop {
            let message = self.recv().await.expect("query reply, got a close");
            let done = message.0 == b'Z';
            reply.push(message);
            if done {
                return reply;
            }
        }
    }
}

/// The first column of every DataRow, as text; panics on an ErrorResponse.
fn rows(reply: &[(u8, Bytes)]) -> Vec<String> {
    reply
        .iter()
        .filter_map(|(tag, body)| match tag {
            b'E' => panic!("query failed: {:?}", error_fields(body)),
            b'D' => {
                let mut body = body.clone();
                assert!(body.get_i16() >= 1);
                let len = body.get_i32() as usize;
                Some(String::from_utf8_lossy(&body[..len]).into_owned())
            }
            _ => None,
        })
        .collect()
}

// ---- startup phase ------------------------------------------------------------------

#[tokio::test]
async fn garbage_startup_packet_gets_fatal_08p01_and_close() {
    let bystander = bystander(&TRUST).await;
    let mut raw = Raw::connect(&addr(&TRUST)).await;
    raw.send(b"GET / HTTP/1.1\r\n\r\n").await;
    let message = raw.expect_fatal(PROTOCOL_VIOLATION).await;
    assert!(
        message.contains("invalid length of startup packet"),
        "{message}"
    );
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn truncated_startup_packet_is_closed_without_reply() {
    let bystander = bystander(&TRUST).await;
    let mut raw = Raw::connect(&addr(&TRUST)).await;
    let mut packet = 100i32.to_be_bytes().to_vec();
    packet.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
    packet.extend_from_slice(b"us");
    assert_eq!(packet.len(), 10);
    raw.send(&packet).await;
    raw.stream.shutdown().await.expect("shutdown write side");
    raw.expect_closed().await;
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn startup_packet_with_impossible_length_gets_fatal_08p01() {
    let bystander = bystander(&TRUST).await;
    // Below the 8-byte minimum (0, negative, too short) or above PostgreSQL's 10,000.
    for len in [0, -1, i32::MIN, 4, 7, 10_001] {
        let mut raw = Raw::connect(&addr(&TRUST)).await;
        let mut packet = len.to_be_bytes().to_vec();
        packet.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
        raw.send(&packet).await;
        let message = raw.expect_fatal(PROTOCOL_VIOLATION).await;
        assert!(
            message.contains("invalid length of startup packet"),
            "length {len}: {message}"
        );
    }
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn unsupported_protocol_version_gets_fatal_0a000() {
    let bystander = bystander(&TRUST).await;
    let mut raw = Raw::connect(&addr(&TRUST)).await;
    raw.send(&startup_message(2 << 16, &[("user", APP_USER)]))
        .await;
    let message = raw.expect_fatal("0A000").await;
    assert!(
        message.contains("unsupported frontend protocol 2.0"),
        "{message}"
    );
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn ssl_and_gssenc_requests_are_refused_with_n_and_login_continues() {
    let bystander = bystander(&TRUST).await;
    for code in [SSL_REQUEST, GSSENC_REQUEST] {
        let mut raw = Raw::connect(&addr(&TRUST)).await;
        let mut request = 8i32.to_be_bytes().to_vec();
        request.extend_from_slice(&code.to_be_bytes());
        raw.send(&request).await;
        let mut answer = [0u8; 1];
        tokio::time::timeout(IO_TIMEOUT, raw.stream.read_exact(&mut answer))
            .await
            .expect("no answer to the encryption request")
            .expect("read the answer");
        assert_eq!(answer, *b"N", "request code {code}");
        // Same connection, now in the clear.
        raw.send(&app_startup()).await;
        raw.finish_login().await;
        assert_eq!(rows(&raw.query("SELECT 1").await), ["1"]);
    }
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn cancel_request_with_unknown_key_is_closed_and_cancels_nothing() {
    let bystander = bystander(&TRUST).await;
    let (mut busy, key) = Raw::login(&addr(&TRUST)).await;

    // Wrong secret for a client that is running a query, and a process id never issued.
    busy.send(&query("SELECT pg_sleep(1)")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (process_id, secret_key) in [
        (key.process_id, key.secret_key.wrapping_add(1)),
        (0, key.secret_key),
    ] {
        let mut raw = Raw::connect(&addr(&TRUST)).await;
        raw.send(&cancel_request(process_id, secret_key)).await;
        raw.expect_closed().await;
    }
    let reply = busy.read_until_ready().await;
    assert_eq!(
        rows(&reply),
        [""],
        "pg_sleep returns void, printed as empty text"
    );

    // Control: the right key does cancel, so the silence above is meaningful.
    busy.send(&query("SELECT pg_sleep(30)")).await;
    // A cancel that arrives before the query reaches the server is lost; retry.
    let mut reply = None;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut raw = Raw::connect(&addr(&TRUST)).await;
        raw.send(&cancel_request(key.process_id, key.secret_key))
            .await;
        raw.expect_closed().await;
        // The error comes after the cancel, so only the RowDescription before it can be lost.
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(1), busy.read_until_ready()).await {
            reply = Some(r);
            break;
        }
    }
    let reply = reply.expect("the query was never cancelled");
    let (_, error) = reply
        .iter()
        .find(|(tag, _)| *tag == b'E')
        .expect("the cancelled query fails");
    assert_eq!(error_fields(error)[&'C'], "57014");

    assert_unharmed(&TRUST, &bystander).await;
}

// ---- after login ---------------------------------------------------------------------

async fn assert_bad_message_after_login_is_fatal(message: &[u8], expect: &str) {
    let bystander = bystander(&TRUST).await;
    let (mut raw, _) = Raw::login(&addr(&TRUST)).await;
    raw.send(message).await;
    let text = raw.expect_fatal(PROTOCOL_VIOLATION).await;
    assert!(text.contains(expect), "want {expect:?} in {text:?}");
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn zero_length_message_after_login_gets_fatal_08p01() {
    assert_bad_message_after_login_is_fatal(&header(b'Q', 0), "invalid message length 0").await;
}

#[tokio::test]
async fn negative_length_message_after_login_gets_fatal_08p01() {
    assert_bad_message_after_login_is_fatal(&header(b'Q', -1), "invalid message length -1").await;
}

#[tokio::test]
async fn message_over_max_message_size_gets_fatal_08p01() {
    // max_message_size = 1kB: a body of 1024 bytes (declared length 1028) is the largest allowed.
    let (mut raw, _) = Raw::login(&addr(&TRUST)).await;
    let at_limit = raw.query(&sql_of_length(1028)).await;
    assert_eq!(rows(&at_limit)[0].len(), 1028 - 15);

    assert_bad_message_after_login_is_fatal(
        &query(&sql_of_length(1029)),
        "over the limit of 1024 bytes",
    )
    .await;
    assert_bad_message_after_login_is_fatal(
        &query(&sql_of_length(2048)),
        "over the limit of 1024 bytes",
    )
    .await;
}

#[tokio::test]
async fn unknown_message_type_gets_fatal_08p01() {
    let mut message = header(b'@', 8);
    message.extend_from_slice(b"junk");
    assert_bad_message_after_login_is_fatal(&message, "invalid frontend message type 64").await;
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

/// A statement whose second part opens with a multi-byte character: read
/// for its session effects, it once panicked the client's task (a byte
/// slice inside `é`). The server's own syntax error comes back instead.
#[tokio::test]
async fn a_statement_opening_with_a_multibyte_character_gets_the_servers_error() {
    let bystander = bystander(&SCRAM).await;
    let client = connect(&conn_string(&addr(&SCRAM), APP_USER, APP_PASSWORD, APP_DB))
        .await
        .expect("login");
    for sql in ["SELECT 1; é", "é; SET application_name = 'x'"] {
        let r = tokio::time::timeout(IO_TIMEOUT, client.batch_execute(sql))
            .await
            .unwrap_or_else(|_| panic!("{sql:?} hung"));
        let e = r.expect_err("a syntax error");
        assert_eq!(db_error(&e).0, "42601", "{sql:?}: {e:?}");
        assert_eq!(select_1(&client).await.expect("still usable"), 1);
    }
    assert_unharmed(&SCRAM, &bystander).await;
}

/// Peak resident memory (VmHWM) and resident memory (VmRSS) of a process, in kB.
fn memory_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// A 50 MB nested query is not handed to the SQL parser (which once took
/// 1.75 GB for 20 MB): it goes to the primary by `default_route`, the
/// server answers it, Fulcrum's peak memory grows by less than 100 MB, and
/// another client is answered all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mb_nested_query_is_not_parsed_and_harms_no_one() {
    let fulcrum = start_fulcrum(&pg_primary().primary().addr(), "trust", "");
    let bystander = bystander(&fulcrum).await;
    let client = connect(&conn_string(
        &addr(&fulcrum),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
    ))
    .await
    .expect("login");
    let depth = 25 * 1024 * 1024;
    let mut sql = String::with_capacity(2 * depth + 16);
    sql.push_str("SELECT ");
    sql.extend(std::iter::repeat_n('(', depth));
    sql.push('1');
    sql.extend(std::iter::repeat_n(')', depth));
    let (_, before) = memory_kb(fulcrum.pid());
    let done = std::sync::atomic::AtomicBool::new(false);
    let huge = async {
        let r = tokio::time::timeout(Duration::from_secs(120), client.simple_query(&sql))
            .await
            .expect("the 50 MB query got no answer in 120 s");
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let meanwhile = async {
        let mut answered = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            // Each answered within IO_TIMEOUT (select_1's bound).
            assert_eq!(select_1(&bystander).await.expect("bystander"), 1);
            answered += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        answered
    };
    let (r, answered) = tokio::join!(huge, meanwhile);
    // PostgreSQL refuses that depth itself (stack depth / parser stack): a
    // clear error from the server, not from Fulcrum's parser.
    match r {
        Ok(_) => {}
        Err(e) => {
            let code = db_error(&e).0;
            assert!(
                matches!(code.as_str(), "54001" | "54000" | "53200" | "42601"),
                "{e:?}"
            );
        }
    }
    assert!(
        answered > 0,
        "the bystander was answered while the query ran"
    );
    let (peak, _) = memory_kb(fulcrum.pid());
    assert!(
        peak.saturating_sub(before) < 100 * 1024,
        "peak RSS grew from {before} kB to {peak} kB"
    );
    assert_eq!(select_1(&client).await.expect("the sender still works"), 1);
    assert_unharmed(&fulcrum, &bystander).await;
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

/// Fulcrum's virtual memory size in bytes (`VmSize` in /proc).
fn vm_size(fulcrum: &FulcrumProcess) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", fulcrum.pid())).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmSize");
    kb * 1024
}

/// A 5-byte header declaring a large message reserves nothing until the
/// bytes come: 16 clients each announcing 200 MB (under a 256 MiB
/// `max_message_size`) and sending 4 bytes of it do not make Fulcrum ask
/// the kernel for 3 GB.
#[tokio::test]
async fn a_declared_length_reserves_memory_only_as_bytes_arrive() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "trust",
        "max_message_size = \"256MB\"\n",
    );
    let bystander = bystander(&fulcrum).await;
    let before = vm_size(&fulcrum);
    let mut held = Vec::new();
    for _ in 0..16 {
        let (mut raw, _) = Raw::login(&addr(&fulcrum)).await;
        let mut message = header(b'Q', 200_000_000);
        message.extend_from_slice(b"SELE");
        raw.send(&message).await;
        held.push(raw);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = vm_size(&fulcrum).saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "16 announced 200 MB messages grew Fulcrum's address space by {} MB",
        grown >> 20
    );
    drop(held);
    assert_unharmed(&fulcrum, &bystander).await;
}

/// One client cannot grow Fulcrum without end by preparing fresh names:
/// past `max_client_prepared_statements` its session ends with 54000, and
/// other clients go on. Statements it closed do not count.
#[tokio::test]
async fn a_client_preparing_without_end_is_stopped_at_its_cap() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "scram-sha-256",
        "max_client_prepared_statements = 5\n",
    );
    let bystander = bystander(&fulcrum).await;
    let client = connect(&conn_string(
        &addr(&fulcrum),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
    ))
    .await
    .expect("login");
    // Closed statements (dropped: tokio-postgres sends Close) do not count.
    for i in 0..10 {
        let s = client
            .prepare(&format!("SELECT {i}"))
            .await
            .expect("prepare");
        drop(s);
    }
    let mut kept = Vec::new();
    for i in 0..5 {
        kept.push(
            client
                .prepare(&format!("SELECT {i} + 1"))
                .await
                .expect("within the cap"),
        );
    }
    let err = client
        .prepare("SELECT 'one too many'")
        .await
        .expect_err("over the cap");
    assert_eq!(err.code().map(|c| c.code()), Some("54000"), "{err:?}");
    assert_unharmed(&fulcrum, &bystander).await;
}

/// The same for session settings (transaction pooling replays each on every
/// server connection the client uses): past `max_client_settings` distinct
/// ones the session ends with 54000 before the SET reaches a server; a
/// setting already tracked may change, RESET frees one, and other clients
/// go on.
#[tokio::test]
async fn a_client_setting_without_end_is_stopped_at_its_cap() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "scram-sha-256",
        "max_client_settings = 5\n",
    );
    let bystander = bystander(&fulcrum).await;
    let client = connect(&conn_string(
        &addr(&fulcrum),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
    ))
    .await
    .expect("login");
    for i in 0..5 {
        client
            .batch_execute(&format!("SET app.k{i} = '{i}'"))
            .await
            .expect("within the cap");
    }
    client
        .batch_execute("SET app.k0 = 'changed'; RESET app.k1")
        .await
        .expect("a tracked setting changes, RESET frees one");
    client
        .batch_execute("SELECT set_config('app.k5', 'x', false)")
        .await
        .expect("the freed place");
    let err = client
        .batch_execute("SET app.k6 = 'one too many'")
        .await
        .expect_err("over the cap");
    assert_eq!(err.code().map(|c| c.code()), Some("54000"), "{err:?}");
    assert_unharmed(&fulcrum, &bystander).await;
}
