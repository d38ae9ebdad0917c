use mysql_common::constants::Command as Com;
use mysql_common::packets::{ComStmtClose, ComStmtExecuteRequestBuilder, ComStmtSendLongData};
use mysql_common::proto::MySerialize;

use super::*;

#[test]
fn command_bytes_match_the_protocol() {
    let cases: [(u8, Command); 18] = [
        (0x01, Command::Quit),
        (0x02, Command::InitDb),
        (0x03, Command::Query),
        (0x04, Command::FieldList),
        (0x09, Command::Statistics),
        (0x0C, Command::ProcessKill),
        (0x0E, Command::Ping),
        (0x11, Command::ChangeUser),
        (0x16, Command::StmtPrepare),
        (0x17, Command::StmtExecute),
        (0x18, Command::StmtSendLongData),
        (0x19, Command::StmtClose),
        (0x1A, Command::StmtReset),
        (0x1B, Command::SetOption),
        (0x1C, Command::StmtFetch),
        (0x1F, Command::ResetConnection),
        (0xFA, Command::StmtBulkExecute),
        (0x00, Command::Unknown(0x00)),
    ];
    for (b, c) in cases {
        assert_eq!(Command::from_byte(b), c, "{b:#x}");
        assert_eq!(c.byte(), b);
    }
    assert_eq!(
        Command::from_byte(0x1E),
        Command::Unknown(Com::COM_BINLOG_DUMP_GTID as u8)
    );
    assert_eq!(command(b""), Err(DecodeError::Truncated("command byte")));
}

#[test]
fn query_prepare_and_init_db_text() {
    let q = build_command(Command::Query, b"SELECT 1");
    assert_eq!(q, b"\x03SELECT 1");
    assert_eq!(command(&q), Ok(Command::Query));
    assert_eq!(query_text(&q), Some(&b"SELECT 1"[..]));
    assert_eq!(prepare_text(&q), None);
    assert_eq!(query_text(b"\x03"), Some(&b""[..]));
    assert_eq!(query_text(b""), None);
    assert_eq!(prepare_text(b"\x16SELECT ?"), Some(&b"SELECT ?"[..]));
    assert_eq!(init_db_schema(b"\x02shop"), Some(&b"shop"[..]));
    assert_eq!(build_command(Command::Ping, b""), [0x0E]);
}

#[test]
fn statement_ids_read_and_rewritten_in_mysql_commons_packets() {
    let mut packets = Vec::new();
    let mut p = Vec::new();
    ComStmtClose::new(0x0102_0304).serialize(&mut p);
    packets.push(p);
    let mut p = Vec::new();
    ComStmtSendLongData::new(0x0102_0304, 1, &b"blob"[..]).serialize(&mut p);
    packets.push(p);
    let mut p = Vec::new();
    ComStmtExecuteRequestBuilder::new(0x0102_0304)
        .build(&[])
        .0
        .serialize(&mut p);
    packets.push(p);
    for mut p in packets {
        let rest = p[5..].to_vec();
        assert_eq!(statement_id(&p), Ok(Some(0x0102_0304)));
        set_statement_id(&mut p, 7).unwrap();
        assert_eq!(statement_id(&p), Ok(Some(7)));
        assert_eq!(&p[1..5], &[7, 0, 0, 0]);
        assert_eq!(p[5..], rest, "the rest is untouched");
    }
}

#[test]
fn statement_ids_of_reset_fetch_and_bulk() {
    for cmd in [
        Command::StmtReset,
        Command::StmtFetch,
        Command::StmtBulkExecute,
    ] {
        let mut p = build_command(cmd, &[9, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(statement_id(&p), Ok(Some(9)));
        set_statement_id(&mut p, LAST_PREPARED).unwrap();
        assert_eq!(&p[1..], &[0xFF, 0xFF, 0xFF, 0xFF, 1, 0, 0, 0]);
    }
}

#[test]
fn statement_id_errors() {
    assert_eq!(statement_id(b"\x03SELECT 1"), Ok(None));
    assert_eq!(
        statement_id(b"\x19\x01\x02"),
        Err(DecodeError::Truncated("statement id"))
    );
    let mut short = *b"\x17\x01\x02\x03";
    assert_eq!(
        set_statement_id(&mut short, 1),
        Err(DecodeError::Truncated("statement id"))
    );
    assert_eq!(&short, b"\x17\x01\x02\x03");
    let mut q = *b"\x03SELECT";
    assert!(set_statement_id(&mut q, 1).is_err());
    assert!(set_statement_id(&mut [], 1).is_err());
}

#[test]
fn prepare_ok_both_ways() {
    let ok = PrepareOk {
        statement_id: 0x0A0B_0C0D,
        num_columns: 2,
        num_params: 3,
        warnings: 1,
    };
    let mut p = build_prepare_ok(&ok);
    assert_eq!(p, [0x00, 0x0D, 0x0C, 0x0B, 0x0A, 2, 0, 3, 0, 0, 1, 0]);
    assert_eq!(parse_prepare_ok(&p), Ok(ok));
    set_prepare_ok_statement_id(&mut p, 42).unwrap();
    assert_eq!(parse_prepare_ok(&p).unwrap().statement_id, 42);
    assert_eq!(&p[5..], &[2, 0, 3, 0, 0, 1, 0]);
}

#[test]
fn prepare_ok_errors() {
    assert_eq!(
        parse_prepare_ok(&[0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Err(DecodeError::Truncated("COM_STMT_PREPARE_OK"))
    );
    let mut err = *b"\xff\x15\x04#28000denied";
    assert!(parse_prepare_ok(&err).is_err());
    assert!(set_prepare_ok_statement_id(&mut err, 1).is_err());
    assert_eq!(&err, b"\xff\x15\x04#28000denied");
}
