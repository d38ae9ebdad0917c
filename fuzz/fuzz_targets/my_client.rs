//! MySQL/MariaDB, client to Fulcrum: packet framing and reassembly, the
//! HandshakeResponse41 (and SSLRequest), COM_CHANGE_USER, and every command
//! Fulcrum reads (command byte, query and prepare text, the second statement
//! of a multi-statement query, COM_INIT_DB, statement ids, COM_STMT_EXECUTE's
//! flags and parameter-type block). Input: four bytes of capability flags,
//! two bytes of parameter count, then the client's packets. Every call must
//! return, never panic.
#![no_main]

use fulcrum_mysql::codec::change_user::parse_change_user;
use fulcrum_mysql::codec::command::{
    command, init_db_schema, prepare_text, query_text, set_statement_id, statement_id,
};
use fulcrum_mysql::codec::handshake::parse_client_hello;
use fulcrum_mysql::codec::packet::{check_packet, reassemble};
use fulcrum_mysql::codec::statements::{second_statement, syntax_error_near};
use fulcrum_mysql::frontend::statements::{execute_flags, execute_types, with_types};
use fulcrum_mysql::CapabilityFlags;
use libfuzzer_sys::fuzz_target;

fn payload(p: &[u8], caps: CapabilityFlags, num_params: u16) {
    let _ = parse_client_hello(p);
    let _ = parse_change_user(p, caps);
    let _ = command(p);
    for text in [query_text(p), prepare_text(p)].into_iter().flatten() {
        if let Some(at) = second_statement(text) {
            assert!(at <= text.len());
            let _ = syntax_error_near(text, at);
        }
    }
    let _ = init_db_schema(p);
    let _ = statement_id(p);
    let _ = set_statement_id(&mut p.to_vec(), 7);
    let _ = execute_flags(p);
    let bound = execute_types(p, num_params).map(<[u8]>::to_vec);
    let types = bound.unwrap_or_else(|| vec![0xFD; 2 * usize::from(num_params)]);
    if let Some(with) = with_types(p, num_params, &types) {
        assert_eq!(execute_types(&with, num_params), Some(&types[..]));
    }
}

fuzz_target!(|data: &[u8]| {
    let [c0, c1, c2, c3, n0, n1, rest @ ..] = data else {
        return;
    };
    let mut buf = rest;
    let caps = CapabilityFlags::from_bits_truncate(u32::from_le_bytes([*c0, *c1, *c2, *c3]));
    let num_params = u16::from_le_bytes([*n0, *n1]);
    let _ = check_packet(buf, 1 << 24);
    payload(buf, caps, num_params);
    while let Ok(Some(msg)) = reassemble(buf, 1 << 20) {
        assert!(msg.span.total <= buf.len());
        payload(&msg.payload, caps, num_params);
        buf = &buf[msg.span.total..];
    }
});
