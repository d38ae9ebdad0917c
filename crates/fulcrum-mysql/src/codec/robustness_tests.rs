//! Every parser against every prefix and every single-byte corruption of
//! valid packets: each must return, never panic (mysql_common's parsers too).

use mysql_common::constants::{CapabilityFlags as C, StatusFlags};

use super::capabilities::OFFERED;
use super::*;

fn samples() -> Vec<Vec<u8>> {
    let state = response::encode_session_state(&[
        response::SessionChange::Gtids(b"3E11FA47-71CA-11E1-9E33-C80AA9429562:23"),
        response::SessionChange::SystemVariable {
            name: b"last_gtid",
            value: b"0-1-42",
        },
    ]);
    vec![
        handshake::build_initial_handshake(&handshake::InitialHandshake {
            server_version: "8.0.36",
            connection_id: 9,
            scramble: [b'a'; 20],
            capabilities: OFFERED,
            charset: 45,
            status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            auth_plugin: "caching_sha2_password",
        }),
        handshake::build_handshake_response(&handshake::HandshakeResponse {
            capabilities: OFFERED,
            max_packet: 1 << 24,
            charset: 45,
            username: "app".into(),
            auth_response: vec![7; 20],
            database: Some("db".into()),
            auth_plugin: Some("mysql_native_password".into()),
            connect_attrs: Some(handshake::encode_connect_attrs(&[("a", "b")])),
            mariadb_capabilities: 0,
        }),
        handshake::build_ssl_request(OFFERED, 1 << 24, 45),
        response::build_ok(
            &response::OkPacket {
                affected_rows: 300,
                last_insert_id: 70_000,
                status: StatusFlags::SERVER_SESSION_STATE_CHANGED,
                info: b"info",
                session_state: &state,
                ..Default::default()
            },
            OFFERED,
        ),
        response::build_eof(0, StatusFlags::SERVER_STATUS_IN_TRANS),
        err::build_error(err::codes::ACCESS_DENIED, "denied"),
        auth_packets::build_auth_switch_scramble("mysql_native_password", &[b'x'; 20]),
        auth_packets::build_auth_more_data(&[3]),
        command::build_command(command::Command::StmtExecute, &[1, 0, 0, 0, 0, 1, 0, 0, 0]),
        command::build_prepare_ok(&command::PrepareOk {
            statement_id: 1,
            num_columns: 2,
            num_params: 3,
            warnings: 0,
        }),
        state,
    ]
}

fn run_all(p: &[u8]) {
    let _ = handshake::parse_client_hello(p);
    let _ = handshake::parse_server_handshake(p);
    for caps in [OFFERED, C::CLIENT_PROTOCOL_41] {
        let _ = response::parse_ok(p, caps);
        let _ = response::is_result_set_end(p, caps);
    }
    if let Ok(ok) = response::parse_ok(p, OFFERED) {
        let _ = response::parse_session_state(ok.session_state);
    }
    let _ = response::parse_session_state(p);
    let _ = response::parse_eof(p);
    let _ = response::status_flags(p);
    let _ = response::classify(p);
    let _ = err::parse_err(p);
    let _ = auth_packets::parse_auth_switch(p);
    let _ = auth_packets::parse_auth_more_data(p);
    let _ = auth_packets::classify_auth_reply(p);
    let _ = command::command(p);
    let _ = command::statement_id(p);
    let _ = command::set_statement_id(&mut p.to_vec(), 5);
    let _ = command::parse_prepare_ok(p);
    let _ = command::set_prepare_ok_statement_id(&mut p.to_vec(), 5);
    let _ = wire::read_lenenc_int(p);
    let _ = wire::read_lenenc_str(p);
    let _ = packet::reassemble(p, 1 << 20);
}

#[test]
fn prefixes_and_corruptions_never_panic() {
    for s in samples() {
        for n in 0..=s.len() {
            run_all(&s[..n]);
        }
        for i in 0..s.len() {
            for b in [
                0x00, 0x01, 0x0A, 0x23, 0x7F, 0x80, 0x87, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF,
            ] {
                let mut m = s.clone();
                m[i] = b;
                run_all(&m);
            }
        }
    }
}
