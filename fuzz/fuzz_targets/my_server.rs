//! MySQL/MariaDB, server to Fulcrum: packet framing and reassembly, the
//! server greeting, OK (with session-state tracking and its GTIDs), ERR, EOF,
//! COM_STMT_PREPARE_OK, AuthSwitchRequest and AuthMoreData, length-encoded
//! values, and the answer tracker (`Reply`: result-set state, several result
//! sets, prepare answers, LOAD DATA LOCAL) fed one message after another.
//! Input: four bytes of capability flags, one byte choosing the command's
//! answer shape, then the server's packets. Every call must return, never
//! panic.
#![no_main]

use fulcrum_mysql::codec::auth_packets::{
    classify_auth_reply, parse_auth_more_data, parse_auth_switch,
};
use fulcrum_mysql::codec::command::{parse_prepare_ok, set_prepare_ok_statement_id};
use fulcrum_mysql::codec::err::parse_err;
use fulcrum_mysql::codec::handshake::parse_server_handshake;
use fulcrum_mysql::codec::packet::reassemble;
use fulcrum_mysql::codec::response::{
    classify, is_result_set_end, last_gtid, parse_eof, parse_ok, parse_session_state, status_flags,
};
use fulcrum_mysql::codec::wire::{read_lenenc_int, read_lenenc_str};
use fulcrum_mysql::frontend::reply::{Reply, Shape};
use fulcrum_mysql::CapabilityFlags;
use libfuzzer_sys::fuzz_target;

fn payload(p: &[u8], caps: CapabilityFlags) {
    if let Ok(h) = parse_server_handshake(p) {
        let _ = h.is_mariadb();
    }
    if let Ok(ok) = parse_ok(p, caps) {
        if let Ok(changes) = parse_session_state(ok.session_state) {
            let _ = last_gtid(&changes);
        }
    }
    if let Ok(changes) = parse_session_state(p) {
        let _ = last_gtid(&changes);
    }
    let _ = is_result_set_end(p, caps);
    let _ = status_flags(p);
    let _ = classify(p);
    let _ = parse_eof(p);
    if let Ok(e) = parse_err(p) {
        let _ = e.message_str();
    }
    let _ = parse_prepare_ok(p);
    let _ = set_prepare_ok_statement_id(&mut p.to_vec(), 7);
    let _ = parse_auth_switch(p);
    let _ = parse_auth_more_data(p);
    let _ = classify_auth_reply(p);
    if let Ok((_, used)) = read_lenenc_int(p) {
        assert!(used <= p.len());
    }
    if let Ok((_, used)) = read_lenenc_str(p) {
        assert!(used <= p.len());
    }
}

fuzz_target!(|data: &[u8]| {
    let [c0, c1, c2, c3, shape, rest @ ..] = data else {
        return;
    };
    let mut buf = rest;
    let caps = CapabilityFlags::from_bits_truncate(u32::from_le_bytes([*c0, *c1, *c2, *c3]));
    let shape = match shape % 5 {
        0 => Shape::Results,
        1 => Shape::Prepare,
        2 => Shape::FieldList,
        3 => Shape::OnePacket,
        _ => Shape::Fetch,
    };
    let mut reply = Some(Reply::new(shape, caps));
    payload(buf, caps);
    while let Ok(Some(msg)) = reassemble(buf, 1 << 20) {
        assert!(msg.span.total <= buf.len());
        payload(&msg.payload, caps);
        if let Some(r) = reply.as_mut() {
            if r.wants_file() {
                r.file_sent();
            }
            if r.on_message(&msg.payload).is_err() {
                reply = None;
            } else {
                let _ = (r.is_done(), r.holds_connection());
            }
        }
        buf = &buf[msg.span.total..];
    }
});
