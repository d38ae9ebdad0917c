//! PostgreSQL, server to Fulcrum: frame boundaries, the fields Fulcrum reads
//! itself (ErrorResponse/NoticeResponse fields, ParameterStatus, command tags,
//! DataRow columns), the login messages it reads through postgres-protocol
//! (authentication requests and their SASL mechanism list, ParameterStatus,
//! BackendKeyData, ReadyForQuery), and the reply queue (`Expectations`) that
//! reads every message of a session's answers. Input: a count byte and that
//! many bytes choosing what the queue expects, then the server's messages.
//! Every call must return, never panic.
#![no_main]

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use fulcrum_postgres::codec::backend_msg::{
    command_tag, parse_data_row, parse_error_fields, parse_parameter_status,
};
use fulcrum_postgres::codec::frame::check_frame;
use fulcrum_postgres::frontend::expect::{Expect, Expectations};
use libfuzzer_sys::fuzz_target;
use postgres_protocol::message::backend::Message;

fn expect(choice: u8) -> Expect {
    let name = || Arc::<str>::from("fulcrum_1");
    match choice % 20 {
        0 => Expect::Parse(None),
        1 => Expect::Parse(Some(name())),
        2 => Expect::SwallowParse(Some(name())),
        3 => Expect::Bind(None),
        4 => Expect::Bind(Some(name())),
        5 => Expect::Close,
        6 => Expect::Describe(None, b'P'),
        7 => Expect::Describe(Some(name()), b'S'),
        8 => Expect::Execute(Vec::new(), None),
        9 => Expect::Sync,
        10 => Expect::Query(Vec::new(), None),
        11 => Expect::Synthetic(Bytes::from_static(b"1\0\0\0\x04")),
        12 => Expect::SyntheticQuery("DEALLOCATE"),
        13 => Expect::SwallowQuery,
        14 => Expect::Position,
        15 => Expect::CommitId { in_batch: false },
        16 => Expect::CommitId { in_batch: true },
        17 => Expect::SwallowClose,
        18 => Expect::SwallowParse(None),
        _ => Expect::CopyEnd,
    }
}

fn login_message(frame: &[u8]) {
    let mut one = BytesMut::from(frame);
    let Ok(Some(msg)) = Message::parse(&mut one) else {
        return;
    };
    match msg {
        Message::AuthenticationSasl(body) => {
            let mut it = body.mechanisms();
            while let Ok(Some(_)) = it.next() {}
        }
        Message::AuthenticationMd5Password(body) => {
            let _ = body.salt();
        }
        Message::AuthenticationSaslContinue(body) => {
            let _ = body.data();
        }
        Message::AuthenticationSaslFinal(body) => {
            let _ = body.data();
        }
        Message::ParameterStatus(body) => {
            let _ = body.name();
            let _ = body.value();
        }
        Message::BackendKeyData(body) => {
            let _ = (body.process_id(), body.secret_key());
        }
        Message::ReadyForQuery(body) => {
            let _ = body.status();
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(count % 32).min(rest.len());
    let (choices, mut buf) = rest.split_at(n);
    let mut queue = Expectations::default();
    for &c in choices {
        if c == 0xFF {
            queue.client_copy_end();
        } else {
            queue.push(expect(c));
        }
    }
    let mut out = BytesMut::new();
    while let Ok(Some(h)) = check_frame(buf, 1 << 20) {
        if buf.len() < h.total {
            break;
        }
        let frame = &buf[..h.total];
        let body = &frame[5..];
        match h.tag {
            b'E' | b'N' => {
                let _ = parse_error_fields(body);
            }
            b'S' => {
                let _ = parse_parameter_status(body);
            }
            b'C' => {
                let _ = command_tag(body);
            }
            b'D' => {
                let _ = parse_data_row(body);
            }
            _ => {}
        }
        login_message(frame);
        let _ = queue.on_server(h.tag, body);
        let _ = queue.take_batch_ops();
        let _ = queue.drain_synthetic(&mut out, b'I');
        let _ = (
            queue.is_empty(),
            queue.only_position(),
            queue.sync_is_ignored(),
        );
        buf = &buf[h.total..];
    }
    // A server lost now, its COMMIT in flight committed: whatever is owed
    // is either answered whole or left as it was.
    let before = queue.is_empty();
    let mut answer = BytesMut::new();
    if !queue.answer_commit(&mut answer, std::time::Instant::now()) {
        assert!(answer.is_empty());
        assert_eq!(queue.is_empty(), before);
    } else {
        assert!(queue.is_empty());
    }
});
