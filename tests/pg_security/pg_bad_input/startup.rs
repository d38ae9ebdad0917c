//! Bad input before login: garbage, truncated and impossibly long startup
//! packets, an unsupported protocol version, SSL and GSSENC requests, and a
//! cancel request with an unknown key.

use std::time::Duration;

use fulcrum_suite::{startup_message, PROTOCOL_3_0};
use fulcrum_testkit::APP_USER;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::helpers::{
    addr, app_startup, assert_unharmed, bystander, error_fields, query, rows, Raw, IO_TIMEOUT,
    PROTOCOL_VIOLATION, TRUST,
};

const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;

fn cancel_request(process_id: i32, secret_key: i32) -> Vec<u8> {
    let mut packet = 16i32.to_be_bytes().to_vec();
    packet.extend_from_slice(&CANCEL_REQUEST.to_be_bytes());
    packet.extend_from_slice(&process_id.to_be_bytes());
    packet.extend_from_slice(&secret_key.to_be_bytes());
    packet
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
