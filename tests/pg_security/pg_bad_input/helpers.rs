//! Helpers shared by the bad-input tests: the daemon, raw protocol messages,
//! a raw client (`Raw`) and checks that bystanders are unharmed.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use fulcrum_suite::{pg_connect_str, pg_primary, startup_message, PROTOCOL_3_0};
use fulcrum_testkit::{free_port, FulcrumProcess, APP_DB, APP_PASSWORD, APP_USER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::Client;

/// Longest any single network step may take before the test fails.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) const PROTOCOL_VIOLATION: &str = "08P01";

/// SCRAM client auth, defaults otherwise: for the tokio-postgres cases.
pub(super) static SCRAM: LazyLock<FulcrumProcess> =
    LazyLock::new(|| start_fulcrum(&pg_primary().primary().addr(), "scram-sha-256", ""));

/// Trust client auth and a 1 kB message limit: for the raw-byte cases.
pub(super) static TRUST: LazyLock<FulcrumProcess> = LazyLock::new(|| {
    start_fulcrum(
        &pg_primary().primary().addr(),
        "trust",
        "max_message_size = \"1kB\"\n",
    )
});

/// Starts Fulcrum on a free port in front of `backend`, retrying if another
/// process took the port first.
pub(super) fn start_fulcrum(backend: &str, client_auth: &str, extra: &str) -> FulcrumProcess {
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

pub(super) fn addr(fulcrum: &FulcrumProcess) -> String {
    fulcrum.listen_addrs()[0].clone()
}

pub(super) fn conn_string(addr: &str, user: &str, password: &str, db: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
    format!(
        "host={host} port={port} user={user} password={password} dbname={db} connect_timeout=10"
    )
}

// ---- tokio-postgres clients ----------------------------------------------------

/// A login (`fulcrum_suite::pg_connect_str`) that must be over within
/// `IO_TIMEOUT`.
pub(super) async fn connect(conn_string: &str) -> Result<Client, tokio_postgres::Error> {
    tokio::time::timeout(IO_TIMEOUT, pg_connect_str(conn_string))
        .await
        .unwrap_or_else(|_| panic!("login hung: {conn_string}"))
}

/// The SQLSTATE, severity and message of a server error.
pub(super) fn db_error(err: &tokio_postgres::Error) -> (String, String, String) {
    let db_error = err
        .as_db_error()
        .unwrap_or_else(|| panic!("expected an ErrorResponse, got {err:?}"));
    (
        db_error.code().code().to_owned(),
        db_error.severity().to_owned(),
        db_error.message().to_owned(),
    )
}

pub(super) async fn select_1(client: &Client) -> Result<i32, tokio_postgres::Error> {
    let row = tokio::time::timeout(IO_TIMEOUT, client.query_one("SELECT 1", &[]))
        .await
        .expect("SELECT 1 hung")?;
    Ok(row.get(0))
}

/// A client connected (and checked) before the bad input is sent.
pub(super) async fn bystander(fulcrum: &FulcrumProcess) -> Client {
    let client = connect(&conn_string(&addr(fulcrum), APP_USER, APP_PASSWORD, APP_DB))
        .await
        .expect("bystander login");
    assert_eq!(select_1(&client).await.expect("bystander SELECT 1"), 1);
    client
}

/// The daemon is still running, did not panic, and still serves `bystander`.
pub(super) async fn assert_unharmed(fulcrum: &FulcrumProcess, bystander: &Client) {
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

pub(super) fn app_startup() -> Vec<u8> {
    startup_message(PROTOCOL_3_0, &[("user", APP_USER), ("database", APP_DB)])
}

pub(super) fn query(sql: &str) -> Vec<u8> {
    let mut message = vec![b'Q'];
    message.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    message.extend_from_slice(sql.as_bytes());
    message.push(0);
    message
}

/// A message header only: a tag and a declared length.
pub(super) fn header(tag: u8, len: i32) -> Vec<u8> {
    let mut message = vec![tag];
    message.extend_from_slice(&len.to_be_bytes());
    message
}

/// The fields of an ErrorResponse body, by field type.
pub(super) fn error_fields(mut body: &[u8]) -> HashMap<char, String> {
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
pub(super) struct Raw {
    pub(super) stream: TcpStream,
    pub(super) buf: BytesMut,
}

/// What BackendKeyData gave a raw login.
#[derive(Debug, Clone, Copy)]
pub(super) struct CancelKey {
    pub(super) process_id: i32,
    pub(super) secret_key: i32,
}

impl Raw {
    pub(super) async fn connect(addr: &str) -> Raw {
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
    pub(super) async fn login(addr: &str) -> (Raw, CancelKey) {
        let mut raw = Raw::connect(addr).await;
        raw.send(&app_startup()).await;
        let key = raw.finish_login().await;
        (raw, key)
    }

    /// Reads AuthenticationOk .. ReadyForQuery after a StartupMessage.
    pub(super) async fn finish_login(&mut self) -> CancelKey {
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

    pub(super) async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(IO_TIMEOUT, self.stream.write_all(bytes))
            .await
            .expect("write hung")
            .expect("write");
    }

    /// The next whole message, or `None` once the server has closed the
    /// connection (a reset counts as closed: Fulcrum may close with our
    /// bytes unread).
    pub(super) async fn recv(&mut self) -> Option<(u8, Bytes)> {
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
    pub(super) async fn expect_closed(&mut self) {
        if let Some((tag, body)) = self.recv().await {
            panic!(
                "expected the connection closed, got {:?} {body:?}",
                tag as char
            );
        }
    }

    /// Asserts a FATAL ErrorResponse with `code`, then the close; returns its message.
    pub(super) async fn expect_fatal(&mut self, code: &str) -> String {
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
    pub(super) async fn query(&mut self, sql: &str) -> Vec<(u8, Bytes)> {
        self.send(&query(sql)).await;
        self.read_until_ready().await
    }

    pub(super) async fn read_until_ready(&mut self) -> Vec<(u8, Bytes)> {
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
pub(super) fn rows(reply: &[(u8, Bytes)]) -> Vec<String> {
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
