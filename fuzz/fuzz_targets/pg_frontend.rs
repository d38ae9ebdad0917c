//! PostgreSQL, client to Fulcrum: the startup packet (StartupMessage,
//! SSLRequest, GSSENCRequest, CancelRequest) with its `options` parameter,
//! frame boundaries, every message body Fulcrum reads (Query, Parse, Bind,
//! Describe, Close, PasswordMessage, SASLInitialResponse) and the routing of a
//! buffered unit of work (`unit_decision`, which reads them all in turn).
//! Execute, Sync, Flush and the copy messages are forwarded unread: only their
//! frames are checked. Every call must return, never panic.
#![no_main]

use std::collections::HashMap;

use fulcrum_postgres::codec::frame::check_frame;
use fulcrum_postgres::codec::frontend_msg::{
    bind_msg, parse_msg, password_msg, query_text, sasl_initial_msg, target_msg,
};
use fulcrum_postgres::codec::startup::{parse_startup, StartupPacket};
use fulcrum_postgres::frontend::startup_options::{parse_options, startup_param_stmt};
use fulcrum_postgres::frontend::unit_route::unit_decision;
use fulcrum_sql::Decision;
use libfuzzer_sys::fuzz_target;

/// The largest message a client may send, as the tests configure it.
const MAX: u64 = 1 << 20;

fn frames(mut buf: &[u8]) {
    while let Ok(Some(h)) = check_frame(buf, MAX) {
        assert!(h.total >= 5, "a frame is at least its header");
        if buf.len() < h.total {
            return;
        }
        let body = &buf[5..h.total];
        match h.tag {
            b'Q' => {
                let _ = query_text(body);
            }
            b'P' => {
                if let Some(p) = parse_msg(body) {
                    assert!(p.definition.len() > p.query.len());
                }
            }
            b'B' => {
                let _ = bind_msg(body);
            }
            b'D' | b'C' => {
                let _ = target_msg(body);
            }
            b'p' => {
                let _ = password_msg(body);
                let _ = sasl_initial_msg(body);
            }
            _ => {}
        }
        buf = &buf[h.total..];
    }
}

fn classify(sql: &[u8]) -> Decision {
    if sql.len().is_multiple_of(2) {
        Decision::Read
    } else {
        Decision::Write
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((packet, used))) = parse_startup(data) {
        assert!(used <= data.len());
        if let StartupPacket::Startup { params, .. } = packet {
            for (name, value) in &params {
                if name == "options" {
                    for (n, v) in parse_options(value) {
                        let _ = startup_param_stmt(&n, &v);
                    }
                }
                let _ = startup_param_stmt(name, value);
            }
        }
        frames(&data[used..]);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for (n, v) in parse_options(text) {
            let _ = startup_param_stmt(&n, &v);
        }
    }
    frames(data);
    let _ = unit_decision(data, MAX, &classify, &HashMap::new(), Decision::Read);
});
