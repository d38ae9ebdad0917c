use std::collections::HashMap;

use mysql_common::constants::{CapabilityFlags as C, StatusFlags};
use mysql_common::io::ParseBuf;
use mysql_common::packets::{self as mc, AuthPlugin, HandshakePacket};
use mysql_common::proto::{MyDeserialize, MySerialize};

use super::*;
use crate::codec::capabilities::OFFERED;

const SCRAMBLE: [u8; 20] = *b"ABCDEFGH0123456789ab";

fn initial() -> InitialHandshake<'static> {
    InitialHandshake {
        server_version: "8.0.36-fulcrum",
        connection_id: 0x0102_0304,
        scramble: SCRAMBLE,
        capabilities: OFFERED,
        charset: 45,
        status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
        auth_plugin: "mysql_native_password",
    }
}

#[test]
fn initial_handshake_exact_bytes() {
    let out = build_initial_handshake(&initial());
    let mut want = vec![10];
    want.extend_from_slice(b"8.0.36-fulcrum\0");
    want.extend_from_slice(&[4, 3, 2, 1]);
    want.extend_from_slice(b"ABCDEFGH\0");
    want.extend_from_slice(&[0x8D, 0xA2]); // capabilities, lower half
    want.push(45);
    want.extend_from_slice(&[0x02, 0x00]); // SERVER_STATUS_AUTOCOMMIT
    want.extend_from_slice(&[0xBF, 0x01]); // capabilities, upper half
    want.push(21); // auth-plugin-data-len: 8 + 12 + NUL
    want.extend_from_slice(&[0; 10]);
    want.extend_from_slice(b"0123456789ab\0");
    want.extend_from_slice(b"mysql_native_password\0");
    assert_eq!(out, want);
}

#[test]
fn initial_handshake_round_trips_through_mysql_common_and_our_parser() {
    let out = build_initial_handshake(&initial());
    let p = HandshakePacket::deserialize((), &mut ParseBuf(&out)).unwrap();
    assert_eq!(p.protocol_version(), 10);
    assert_eq!(p.server_version_ref(), b"8.0.36-fulcrum");
    assert_eq!(p.connection_id(), 0x0102_0304);
    assert_eq!(p.nonce(), SCRAMBLE);
    assert_eq!(p.capabilities(), OFFERED);
    assert_eq!(p.auth_plugin(), Some(AuthPlugin::MysqlNativePassword));
    let s = parse_server_handshake(&out).unwrap();
    assert_eq!(s.scramble, SCRAMBLE);
    assert_eq!(s.server_version, "8.0.36-fulcrum");
    assert_eq!(s.connection_id, 0x0102_0304);
    assert_eq!((s.capabilities, s.charset), (OFFERED, 45));
    assert_eq!(s.status, StatusFlags::SERVER_STATUS_AUTOCOMMIT);
    assert_eq!(s.auth_plugin.as_deref(), Some("mysql_native_password"));
    assert!(!s.is_mariadb());
}

/// A MariaDB 10.11 greeting laid out by hand from the spec: CLIENT_MYSQL
/// (bit 0) clear, extended capabilities in the last 4 filler bytes, and the
/// plugin name without its NUL, as some servers send it.
#[test]
fn parses_a_mariadb_greeting() {
    let caps = (OFFERED - C::CLIENT_LONG_PASSWORD).bits();
    let mut p = vec![10];
    p.extend_from_slice(b"5.5.5-10.11.6-MariaDB-log\0");
    p.extend_from_slice(&77u32.to_le_bytes());
    p.extend_from_slice(b"abcdefgh\0");
    p.extend_from_slice(&(caps as u16).to_le_bytes());
    p.push(8);
    p.extend_from_slice(&[0x22, 0x00]);
    p.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&0x1Du32.to_le_bytes());
    p.extend_from_slice(b"ijklmnopqrst\0");
    p.extend_from_slice(b"mysql_native_password");
    let s = parse_server_handshake(&p).unwrap();
    assert!(s.is_mariadb());
    assert_eq!(&s.scramble, b"abcdefghijklmnopqrst");
    assert_eq!(s.connection_id, 77);
    assert_eq!(s.mariadb_capabilities, 0x1D);
    assert_eq!(s.auth_plugin.as_deref(), Some("mysql_native_password"));
    assert_eq!(s.charset, 8);
}

#[test]
fn parses_mysql_commons_mariadb_greeting() {
    use mysql_common::constants::MariadbCapabilities as M;
    let caps = OFFERED - C::CLIENT_LONG_PASSWORD;
    let p = HandshakePacket::new(
        10,
        &b"5.5.5-11.4.2-MariaDB"[..],
        5,
        *b"12345678",
        Some(&b"9abcdefghijk\0"[..]),
        caps,
        33,
        StatusFlags::SERVER_STATUS_IN_TRANS,
        Some(&b"client_ed25519"[..]),
    )
    .with_mariadb_ext_capabilities(M::MARIADB_CLIENT_STMT_BULK_OPERATIONS);
    let mut out = Vec::new();
    p.serialize(&mut out);
    let s = parse_server_handshake(&out).unwrap();
    assert_eq!(&s.scramble, b"123456789abcdefghijk");
    assert_eq!((s.capabilities, s.charset, s.connection_id), (caps, 33, 5));
    assert_eq!(s.status, StatusFlags::SERVER_STATUS_IN_TRANS);
    assert_eq!(
        s.mariadb_capabilities,
        M::MARIADB_CLIENT_STMT_BULK_OPERATIONS.bits()
    );
    assert_eq!(s.auth_plugin.as_deref(), Some("client_ed25519"));
    assert!(s.is_mariadb());
}

/// mysql_common's `HandshakePacket` computes `len as i8 - 8`, which overflows
/// for 0x80..=0x87; ours reads the length unsigned.
#[test]
fn auth_plugin_data_length_over_127() {
    let mut out = build_initial_handshake(&initial());
    let at = 1 + b"8.0.36-fulcrum\0".len() + 4 + 8 + 1 + 2 + 1 + 2 + 2;
    assert_eq!(out[at], 21);
    out[at] = 0x80;
    assert_eq!(
        parse_server_handshake(&out),
        Err(DecodeError::Truncated("auth-plugin-data part 2"))
    );
    // Without PLUGIN_AUTH a server may send 0: part 2 is still 13 bytes.
    out[at] = 0;
    assert_eq!(parse_server_handshake(&out).unwrap().scramble, SCRAMBLE);
}

#[test]
fn server_greeting_errors_without_panics() {
    let out = build_initial_handshake(&initial());
    // Every prefix up to the end of the scramble is an error.
    let scramble_end = out.len() - b"mysql_native_password\0".len();
    for n in 0..scramble_end {
        assert!(parse_server_handshake(&out[..n]).is_err(), "prefix {n}");
    }
    assert_eq!(
        parse_server_handshake(b"\xff\x10\x04Too many connections"),
        Err(DecodeError::Malformed("not an Initial Handshake v10"))
    );
}

fn sample_response() -> HandshakeResponse {
    HandshakeResponse {
        capabilities: OFFERED,
        max_packet: 16 << 20,
        charset: 255,
        username: "app".into(),
        auth_response: (1..=20).collect(),
        database: Some("shop".into()),
        auth_plugin: Some("caching_sha2_password".into()),
        connect_attrs: Some(encode_connect_attrs(&[("_client_name", "libmysql")])),
        mariadb_capabilities: 0,
    }
}

#[test]
fn handshake_response_exact_bytes_and_round_trip() {
    let r = sample_response();
    let out = build_handshake_response(&r);
    let mut want = OFFERED.bits().to_le_bytes().to_vec();
    want.extend_from_slice(&[0, 0, 0, 1, 255]);
    want.extend_from_slice(&[0; 23]);
    want.extend_from_slice(b"app\0");
    want.push(20);
    want.extend(1..=20u8);
    want.extend_from_slice(b"shop\0caching_sha2_password\0");
    want.push(22);
    want.extend_from_slice(b"\x0c_client_name\x08libmysql");
    assert_eq!(out, want);
    assert_eq!(parse_client_hello(&out), Ok(ClientHello::Response(r)));
}

#[test]
fn our_response_parses_in_mysql_common() {
    let out = build_handshake_response(&sample_response());
    let p = mc::HandshakeResponse::deserialize((), &mut ParseBuf(&out)).unwrap();
    assert_eq!(p.user(), b"app");
    assert_eq!(p.scramble_buf(), (1..=20).collect::<Vec<u8>>());
    assert_eq!(p.db_name(), Some(&b"shop"[..]));
    assert_eq!(p.auth_plugin(), Some(&AuthPlugin::CachingSha2Password));
    assert_eq!(p.collation(), 255);
    let attrs = p.connect_attributes().unwrap();
    assert_eq!(attrs["_client_name"], "libmysql");
}

#[test]
fn mysql_commons_response_parses_in_ours() {
    let attrs = HashMap::from([("program_name".to_string(), "mysql".to_string())]);
    let scramble = vec![0xAB; 32];
    let p = mc::HandshakeResponse::new(
        Some(&scramble[..]),
        (8, 0, 36),
        Some(&b"root"[..]),
        None::<&[u8]>,
        Some(AuthPlugin::MysqlNativePassword),
        OFFERED,
        Some(attrs),
        1 << 24,
    );
    let mut out = Vec::new();
    p.serialize(&mut out);
    let ClientHello::Response(r) = parse_client_hello(&out).unwrap() else {
        panic!("not a response")
    };
    assert_eq!(r.username, "root");
    assert_eq!(r.auth_response, scramble);
    assert_eq!(r.database, None);
    assert_eq!(r.auth_plugin.as_deref(), Some("mysql_native_password"));
    assert_eq!(r.max_packet, 1 << 24);
    assert_eq!(r.connect_attrs.unwrap(), b"\x0cprogram_name\x05mysql");
}

#[test]
fn ssl_request_both_ways() {
    let caps = OFFERED | C::CLIENT_SSL;
    let ours = build_ssl_request(OFFERED, 1 << 24, 45);
    let mut theirs = Vec::new();
    mc::SslRequest::new(caps, 1 << 24, 45).serialize(&mut theirs);
    assert_eq!(ours, theirs);
    assert_eq!(ours.len(), SSL_REQUEST_LEN);
    assert_eq!(
        parse_client_hello(&ours),
        Ok(ClientHello::SslRequest {
            capabilities: caps,
            max_packet: 1 << 24,
            charset: 45
        })
    );
    // After TLS the full response comes with SSL still set.
    let mut r = sample_response();
    r.capabilities |= C::CLIENT_SSL;
    let out = build_handshake_response(&r);
    assert!(matches!(
        parse_client_hello(&out),
        Ok(ClientHello::Response(_))
    ));
}

#[test]
fn one_byte_and_nul_terminated_auth_responses() {
    let mut r = sample_response();
    r.capabilities -= C::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA;
    let out = build_handshake_response(&r);
    assert_eq!(parse_client_hello(&out), Ok(ClientHello::Response(r)));

    let mut p = (C::CLIENT_PROTOCOL_41).bits().to_le_bytes().to_vec();
    p.extend_from_slice(&[0; 28]);
    p.extend_from_slice(b"bob\0secret\0");
    let ClientHello::Response(r) = parse_client_hello(&p).unwrap() else {
        panic!("not a response")
    };
    assert_eq!(
        (r.username.as_str(), &r.auth_response[..]),
        ("bob", &b"secret"[..])
    );
    assert_eq!(
        (r.database, r.auth_plugin, r.connect_attrs),
        (None, None, None)
    );
}

fn header(caps: C) -> Vec<u8> {
    let mut p = caps.bits().to_le_bytes().to_vec();
    p.extend_from_slice(&[0; 28]);
    p
}

#[test]
fn malicious_client_responses_are_errors() {
    let lenenc = C::CLIENT_PROTOCOL_41 | C::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA;
    let cases: Vec<(Vec<u8>, DecodeError)> = vec![
        (
            [header(lenenc), b"u\0\xfc\xff\xff".to_vec()].concat(),
            DecodeError::Truncated("auth response"),
        ),
        (
            [
                header(lenenc),
                b"u\0\xfe\xff\xff\xff\xff\xff\xff\xff\xff".to_vec(),
            ]
            .concat(),
            DecodeError::Truncated("auth response"),
        ),
        (
            [
                header(C::CLIENT_PROTOCOL_41 | C::CLIENT_SECURE_CONNECTION),
                b"u\0\x14abc".to_vec(),
            ]
            .concat(),
            DecodeError::Truncated("auth response"),
        ),
        (
            [header(lenenc), b"no-nul".to_vec()].concat(),
            DecodeError::Truncated("username"),
        ),
        (
            [
                header(lenenc | C::CLIENT_CONNECT_ATTRS),
                b"u\0\x00\xfa\x01".to_vec(),
            ]
            .concat(),
            DecodeError::Truncated("connection attributes"),
        ),
        (
            [
                header(lenenc | C::CLIENT_CONNECT_WITH_DB),
                b"u\0\x00db".to_vec(),
            ]
            .concat(),
            DecodeError::Truncated("database"),
        ),
        (
            [header(lenenc), b"\xff\xfe\0\0".to_vec()].concat(),
            DecodeError::NotUtf8("username"),
        ),
        (
            header(C::CLIENT_LONG_PASSWORD),
            DecodeError::Malformed("client does not speak protocol 4.1"),
        ),
    ];
    for (p, want) in cases {
        assert_eq!(parse_client_hello(&p), Err(want), "{p:?}");
    }
    let out = build_handshake_response(&sample_response());
    for n in 0..out.len() {
        let _ = parse_client_hello(&out[..n]); // never panics
    }
    for n in 0..36 {
        assert!(parse_client_hello(&out[..n]).is_err(), "prefix {n}");
    }
}

#[test]
fn scrambles_have_no_nul_or_dollar() {
    let s = make_scramble([
        0x00, 0x80, b'$', 0xA4, 0xFF, 0x41, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7,
    ]);
    assert_eq!(&s[..6], &[1, 1, b'%', b'%', 0x7F, 0x41]);
    assert!(s.iter().all(|&b| b != 0 && b != b'$' && b < 0x80));
}
