use mysql_common::constants::{CapabilityFlags as C, StatusFlags as S};
use mysql_common::io::ParseBuf;
use mysql_common::packets::session_state_change::SessionStateChange;
use mysql_common::packets::{
    CommonOkPacket, OkPacket as McOk, OkPacketDeserializer, OldEofPacket, ResultSetTerminator,
};
use mysql_common::proto::MyDeserialize;

use super::*;

const TRACK: C = C::CLIENT_PROTOCOL_41
    .union(C::CLIENT_SESSION_TRACK)
    .union(C::CLIENT_DEPRECATE_EOF);
const PLAIN: C = C::CLIENT_PROTOCOL_41;

fn theirs<K: mysql_common::packets::OkPacketKind>(bytes: &[u8], caps: C) -> McOk<'_> {
    OkPacketDeserializer::<K>::deserialize(caps, &mut ParseBuf(bytes))
        .unwrap()
        .into_inner()
}

#[test]
fn classifies_first_packets() {
    let cases: [(&[u8], ResponseKind); 7] = [
        (b"\x00\x00\x00\x02\x00\x00\x00", ResponseKind::Ok),
        (b"\xff\x15\x04#28000denied", ResponseKind::Err),
        (b"\xfe\x00\x00\x02\x00", ResponseKind::Eof),
        (b"\xfbdata.csv", ResponseKind::LocalInfile),
        (b"\x03", ResponseKind::ResultSet { columns: 3 }),
        (b"\xfa", ResponseKind::ResultSet { columns: 250 }),
        (b"\xfc\x2c\x01", ResponseKind::ResultSet { columns: 300 }),
    ];
    for (p, want) in cases {
        assert_eq!(classify(p), Ok(want), "{p:?}");
    }
    assert_eq!(
        classify(b""),
        Err(DecodeError::Truncated("response header"))
    );
    assert_eq!(
        classify(b"\xfc\x01"),
        Err(DecodeError::Truncated("column count"))
    );
}

#[test]
fn ok_exact_bytes_and_mysql_common_agrees() {
    let ok = OkPacket {
        affected_rows: 300,
        last_insert_id: 0x1_0000,
        status: S::SERVER_STATUS_AUTOCOMMIT,
        warnings: 1,
        info: b"Rows matched: 300",
        ..OkPacket::default()
    };
    let out = build_ok(&ok, PLAIN);
    let mut want = vec![
        0x00, 0xFC, 0x2C, 0x01, 0xFD, 0x00, 0x00, 0x01, 0x02, 0x00, 0x01, 0x00,
    ];
    want.push(17);
    want.extend_from_slice(b"Rows matched: 300");
    assert_eq!(out, want);
    assert_eq!(parse_ok(&out, PLAIN), Ok(ok));
    let m = theirs::<CommonOkPacket>(&out, PLAIN);
    assert_eq!(
        (m.affected_rows(), m.last_insert_id()),
        (300, Some(0x1_0000))
    );
    assert_eq!(
        (m.status_flags(), m.warnings()),
        (S::SERVER_STATUS_AUTOCOMMIT, 1)
    );
    assert_eq!(m.info_ref(), Some(&b"Rows matched: 300"[..]));
    assert_eq!(status_flags(&out), Some(S::SERVER_STATUS_AUTOCOMMIT));
}

#[test]
fn minimal_ok_and_info_as_string_eof() {
    assert_eq!(build_ok(&OkPacket::default(), TRACK), [0, 0, 0, 0, 0, 0, 0]);
    let ok = parse_ok(b"\x00\x01\x00\x02\x00\x00\x00Records: 1", PLAIN).unwrap();
    assert_eq!(ok.info, b"Records: 1");
}

/// An INSERT under `session_track_gtids=OWN_GTID` on MySQL 8, laid out from
/// the spec: info empty, one SESSION_TRACK_GTIDS entry.
#[test]
fn mysql_gtid_tracker() {
    let gtid = b"3E11FA47-71CA-11E1-9E33-C80AA9429562:23";
    let mut p = vec![0x00, 0x01, 0x05, 0x02, 0x40, 0x00, 0x00, 0x00];
    p.push(gtid.len() as u8 + 4);
    p.extend_from_slice(&[0x03, gtid.len() as u8 + 2, 0x00, gtid.len() as u8]);
    p.extend_from_slice(gtid);
    let ok = parse_ok(&p, TRACK).unwrap();
    assert_eq!((ok.affected_rows, ok.last_insert_id), (1, 5));
    assert!(ok.status.contains(S::SERVER_SESSION_STATE_CHANGED));
    let changes = parse_session_state(ok.session_state).unwrap();
    assert_eq!(changes, [SessionChange::Gtids(gtid)]);
    assert_eq!(last_gtid(&changes), Some(&gtid[..]));
    // Our encoder writes the same bytes, and the packet round-trips.
    assert_eq!(encode_session_state(&changes), ok.session_state);
    assert_eq!(build_ok(&ok, TRACK), p);
    // mysql_common keeps the tracker's data raw: encoding byte, then the set.
    let m = theirs::<CommonOkPacket>(&p, TRACK);
    let infos = m.session_state_info().unwrap();
    match infos[0].decode().unwrap() {
        SessionStateChange::Gtids(g) => assert_eq!(&g.as_bytes()[2..], gtid),
        other => panic!("{other:?}"),
    }
}

#[test]
fn mariadb_last_gtid_and_every_tracker_type() {
    let changes = [
        SessionChange::SystemVariable {
            name: b"autocommit",
            value: b"ON",
        },
        SessionChange::SystemVariable {
            name: b"last_gtid",
            value: b"0-1-42",
        },
        SessionChange::Schema(b"shop"),
        SessionChange::StateChange(true),
        SessionChange::TransactionCharacteristics(b"START TRANSACTION;"),
        SessionChange::TransactionState(b"T_______"),
        SessionChange::Unknown {
            kind: 0x40,
            data: b"\x01x",
        },
    ];
    let state = encode_session_state(&changes);
    assert_eq!(parse_session_state(&state).unwrap(), changes);
    assert_eq!(last_gtid(&changes), Some(&b"0-1-42"[..]));
    let ok = OkPacket {
        status: S::SERVER_STATUS_IN_TRANS | S::SERVER_SESSION_STATE_CHANGED,
        session_state: &state,
        ..OkPacket::default()
    };
    let out = build_ok_as_eof(&ok, TRACK);
    assert_eq!(out[0], EOF);
    assert_eq!(parse_ok(&out, TRACK), Ok(ok));
    assert!(is_result_set_end(&out, TRACK));
    // mysql_common rejects the whole state for one unknown tracker type, so it
    // reads the known ones only.
    let known = encode_session_state(&changes[..6]);
    let out = build_ok_as_eof(
        &OkPacket {
            session_state: &known,
            ..ok
        },
        TRACK,
    );
    let m = theirs::<ResultSetTerminator>(&out, TRACK);
    assert_eq!(m.session_state_info_ref(), Some(&known[..]));
    match m.session_state_info().unwrap()[1].decode().unwrap() {
        SessionStateChange::SystemVariables(v) => {
            assert_eq!(
                (v[0].name_bytes(), v[0].value_bytes()),
                (&b"last_gtid"[..], &b"0-1-42"[..])
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn several_variables_in_one_entry() {
    let state = b"\x00\x0a\x01a\x011\x01b\x03two";
    assert_eq!(
        parse_session_state(state).unwrap(),
        [
            SessionChange::SystemVariable {
                name: b"a",
                value: b"1"
            },
            SessionChange::SystemVariable {
                name: b"b",
                value: b"two"
            },
        ]
    );
}

#[test]
fn eof_both_forms_and_status_flags() {
    let status = S::SERVER_STATUS_IN_TRANS | S::SERVER_MORE_RESULTS_EXISTS;
    let eof = build_eof(2, status);
    assert_eq!(eof, [0xFE, 0x02, 0x00, 0x09, 0x00]);
    assert_eq!(parse_eof(&eof), Ok((2, status)));
    assert_eq!(status_flags(&eof), Some(status));
    let m = theirs::<OldEofPacket>(&eof, PLAIN);
    assert_eq!((m.warnings(), m.status_flags()), (2, status));
    assert!(is_result_set_end(&eof, PLAIN));

    let ok_eof = build_ok_as_eof(
        &OkPacket {
            status,
            ..OkPacket::default()
        },
        TRACK,
    );
    assert_eq!(ok_eof, [0xFE, 0, 0, 0x09, 0x00, 0, 0]);
    assert_eq!(status_flags(&ok_eof), Some(status));
    assert!(parse_eof(&ok_eof).is_err());
    assert!(
        !is_result_set_end(&[0xFE; 9], PLAIN),
        "a row, without DEPRECATE_EOF"
    );
    assert!(is_result_set_end(&ok_eof, TRACK));
    // A first row packet of a 16 MiB value starts with 0xFE but is full.
    let mut row = vec![0xFE];
    row.resize(MAX_PAYLOAD, 0);
    assert!(!is_result_set_end(&row, TRACK));
    assert_eq!(status_flags(b"\xff\x15\x04#28000x"), None);
    assert_eq!(status_flags(b"\x03"), None);
}

#[test]
fn truncated_and_malicious_ok_packets() {
    let cases: [(&[u8], DecodeError); 6] = [
        (b"", DecodeError::Truncated("OK header")),
        (b"\x00\xfc\x01", DecodeError::Truncated("affected rows")),
        (b"\x00\x00\x00\x02", DecodeError::Truncated("status flags")),
        (
            b"\x00\x00\xff\x02\x00\x00\x00",
            DecodeError::BadLenEnc("last insert id", 0xFF),
        ),
        (
            b"\x00\x00\x00\x00\x40\x00\x00\x00\xfd\xff\xff\xff",
            DecodeError::Truncated("session state"),
        ),
        (
            b"\x05\x00\x00\x00\x00\x00\x00",
            DecodeError::Malformed("not an OK packet"),
        ),
    ];
    for (p, want) in cases {
        assert_eq!(parse_ok(p, TRACK), Err(want), "{p:?}");
    }
    assert_eq!(
        parse_ok(b"\x00\x00\x00\x00\x00\x00\x00\x09ab", TRACK),
        Err(DecodeError::Truncated("info"))
    );
    assert_eq!(
        parse_ok(b"\x00\xfb\x00\x00\x00\x00\x00", TRACK),
        Err(DecodeError::UnexpectedNull("affected rows"))
    );
    // Session-state entries claiming more than remains.
    for s in [
        &b"\x03\x09\x00\x05ab"[..],
        b"\x00\x03\x05ab",
        b"\x03\x01",
        b"\x01",
        b"\x00\x02\x01a",
    ] {
        assert!(parse_session_state(s).is_err(), "{s:?}");
    }
    assert!(parse_eof(b"\xfe\x00").is_err());
}

#[test]
fn status_flags_are_rewritten_in_place_in_both_end_forms() {
    let idle = S::SERVER_STATUS_AUTOCOMMIT | S::SERVER_STATUS_NO_INDEX_USED;
    let in_txn = |s: S| s | S::SERVER_STATUS_IN_TRANS;
    let mut eof = build_eof(0, idle);
    assert!(set_status_flags(&mut eof, in_txn));
    assert_eq!(parse_eof(&eof), Ok((0, in_txn(idle))));

    // An OK-as-EOF with a 2-byte affected-rows count: the flags move.
    let ok = OkPacket {
        affected_rows: 300,
        status: idle,
        warnings: 1,
        ..OkPacket::default()
    };
    let mut ok_eof = build_ok_as_eof(&ok, TRACK);
    assert!(set_status_flags(&mut ok_eof, in_txn));
    let back = parse_ok(&ok_eof, TRACK).unwrap();
    assert_eq!(
        (back.affected_rows, back.status, back.warnings),
        (300, in_txn(idle), 1)
    );

    let mut err = b"\xff\x15\x04#28000x".to_vec();
    assert!(!set_status_flags(&mut err, in_txn));
    assert_eq!(err, b"\xff\x15\x04#28000x");
}
