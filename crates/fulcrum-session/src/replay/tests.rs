use super::*;

#[test]
fn checksum_is_the_same_whatever_the_pieces() {
    let mut whole = Checksum::default();
    whole.feed(b"CBEGIN\0DrowCUPDATE 1\0");
    let mut parts = Checksum::default();
    for piece in [&b"CBEG"[..], b"IN\0Dr", b"", b"owCUPDATE 1\0"] {
        parts.feed(piece);
    }
    assert_eq!(whole, parts);
    let mut other = Checksum::default();
    other.feed(b"CBEGIN\0DrOwCUPDATE 1\0");
    assert_ne!(whole, other);
    // Every split of a longer stream into two and three pieces.
    let data: Vec<u8> = (0..97u8).map(|b| b.wrapping_mul(31)).collect();
    let mut one = Checksum::default();
    one.feed(&data);
    for i in 0..data.len() {
        for j in i..data.len() {
            let mut c = Checksum::default();
            c.feed(&data[..i]);
            c.feed(&data[i..j]);
            c.feed(&data[j..]);
            assert_eq!(c, one, "pieces at {i}, {j}");
        }
    }
    // One byte changed anywhere, or one byte less, is seen.
    for i in 0..data.len() {
        let mut changed = data.clone();
        changed[i] ^= 0x40;
        let mut c = Checksum::default();
        c.feed(&changed);
        assert_ne!(c, one, "byte {i} changed");
    }
    let mut short = Checksum::default();
    short.feed(&data[..96]);
    assert_ne!(short, one);
}

fn open_log(max: u64) -> TxnLog {
    let mut log = TxnLog::new(Some(max), Framing::Whole);
    log.open(100, None);
    log
}

#[test]
fn off_keeps_nothing() {
    let mut log = TxnLog::new(None, Framing::Whole);
    log.open(0, Some("BEGIN".into()));
    log.record(b"Q...");
    assert!(!log.is_open() && !log.replayable());
    let mut log = TxnLog::new(Some(0), Framing::Whole);
    log.open(0, Some("BEGIN".into()));
    assert!(!log.enabled() && !log.is_open(), "a size of 0 is off too");
}

#[test]
fn a_session_carries_one_pointer_for_its_log() {
    // Every client's session holds a log (issue 44: memory per idle client).
    assert_eq!(std::mem::size_of::<TxnLog>(), std::mem::size_of::<usize>());
}

#[test]
fn replayable_only_from_the_statement_that_began_it() {
    let mut log = open_log(1024);
    log.record(b"Qbegin");
    assert!(!log.replayable(), "not before its BEGIN completed");
    log.command_done(true);
    log.record(b"Qupdate");
    log.command_done(false);
    assert!(log.replayable());

    let mut log = open_log(1024);
    log.opens_with_begin();
    log.record(b"Qbegin; update");
    assert!(log.replayable(), "a BEGIN in flight");
    log.command_done(true);
    assert!(log.replayable());

    let mut log = open_log(1024);
    log.record(b"Qinsert; begin");
    log.command_done(false);
    log.command_done(true);
    assert!(!log.replayable(), "an INSERT committed before the BEGIN");

    let mut log = TxnLog::new(Some(1024), Framing::Whole);
    log.open(0, Some("BEGIN".into()));
    assert!(log.replayable(), "a deferred BEGIN starts it");
}

#[test]
fn too_large_a_transaction_is_not_kept() {
    let mut log = open_log(10);
    log.command_done(true);
    log.record(b"0123456");
    assert!(log.replayable());
    log.record(b"789ab");
    assert!(!log.replayable() && log.is_open());
    log.record(b"x");
    log.close();
    log.open(0, Some("BEGIN".into()));
    assert!(log.replayable(), "the next transaction is kept again");
}

#[test]
fn output_written_unchecked_spoils_it() {
    let mut log = open_log(1024);
    log.command_done(true);
    // 5 bytes queued after the open at 100, all still in the buffer.
    log.absorb(b"xxABCDE", 105);
    assert!(log.replayable());
    // 10 more, but only 4 still queued: 6 went out unseen.
    log.absorb(b"wxyz", 115);
    assert!(!log.replayable());
}

#[test]
fn a_replay_matches_what_the_client_received() {
    let mut log = open_log(1024);
    log.command_done(true);
    log.record(b"Qbegin;Qupdate");
    log.absorb(b"old|CBEGIN", 106);
    log.absorb(b"CBEGINCUPDATE 1", 115);
    let mut replay = log.start_replay(200);
    assert_eq!(replay.frames, b"Qbegin;Qupdate");
    assert_eq!(replay.expected.len(), 15);
    // The replayed output arrives in pieces; the last piece carries the
    // answer to the statement that was in flight.
    assert_eq!(replay.compare(b"CBEGIN"), Compare::More);
    assert!(replay.is_short());
    assert_eq!(
        replay.compare(b"CUPDATE 1CSELECT 1"),
        Compare::Matched { taken: 9 }
    );
}

#[test]
fn a_different_answer_is_caught() {
    let mut log = open_log(1024);
    log.command_done(true);
    log.absorb(b"CBEGINDrow 1CSELECT 1", 121);
    let mut replay = log.start_replay(0);
    assert_eq!(replay.compare(b"CBEGINDrow 2CSELECT 1"), Compare::Differs);
    replay.restart();
    assert_eq!(
        replay.compare(b"CBEGINDrow 1CSELECT 1"),
        Compare::Matched { taken: 21 }
    );
}

/// PostgreSQL frames: `tag`, length, body.
fn pg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut f = vec![tag];
    f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    f.extend_from_slice(body);
    f
}

#[test]
fn parameter_status_is_left_out_of_the_comparison() {
    let begin = pg(b'C', b"BEGIN\0");
    let ready = pg(b'Z', b"T");
    let row = pg(b'D', b"\0\x01\0\0\0\x011");
    let status = pg(b'S', b"in_hot_standby\0off\0");
    let mut log = TxnLog::new(Some(1024), Framing::Postgres);
    log.open(0, None);
    log.command_done(true);
    let received = [begin.clone(), ready.clone(), row.clone()].concat();
    // Absorbed in pieces that cut frames anywhere.
    log.absorb(&received[..3], 3);
    log.absorb(&received[3..], received.len() as u64);
    let mut replay = log.start_replay(100);
    // The new primary reports a parameter in the middle of it.
    let replayed = [begin, status.clone(), ready, row, pg(b'C', b"SELECT 1\0")].concat();
    let cut = 7;
    assert_eq!(replay.compare(&replayed[..cut]), Compare::More);
    let rest = &replayed[cut..];
    let tail = pg(b'C', b"SELECT 1\0").len();
    assert_eq!(
        replay.compare(rest),
        Compare::Matched {
            taken: rest.len() - tail
        }
    );

    // A row that differs still differs.
    let mut log = TxnLog::new(Some(1024), Framing::Postgres);
    log.open(0, None);
    log.command_done(true);
    log.absorb(&received, received.len() as u64);
    let mut replay = log.start_replay(100);
    let other = pg(b'D', b"\0\x01\0\0\0\x012");
    let replayed = [pg(b'C', b"BEGIN\0"), pg(b'Z', b"T"), other].concat();
    assert_eq!(replay.compare(&replayed), Compare::Differs);
}

#[test]
fn a_replay_is_logged_again() {
    let mut log = TxnLog::new(Some(1024), Framing::Whole);
    log.open(0, Some("BEGIN".into()));
    log.record(b"Qupdate");
    let replay = log.start_replay(50);
    assert_eq!(replay.begin.as_deref(), Some("BEGIN"));
    assert!(log.replayable(), "the replayed transaction is logged anew");
    log.record(b"Qupdate");
    let again = log.start_replay(60);
    assert_eq!(again.frames, b"Qupdate");
}

#[test]
fn a_mismatch_names_the_first_message_that_differs() {
    let mut log = TxnLog::new(Some(1 << 20), Framing::Postgres);
    log.open(0, None);
    log.command_done(true);
    let received: Vec<u8> = [
        pg(b'C', b"BEGIN\0"),
        pg(b'D', b"\0\x01\0\0\0\x02-5"),
        pg(b'C', b"SELECT 1\0"),
    ]
    .concat();
    log.absorb(&received, received.len() as u64);
    let mut replay = log.start_replay(received.len() as u64);
    // The same, in two pieces, matches.
    let mut same = replay.clone();
    assert_eq!(same.compare(&received[..9]), Compare::More);
    assert!(matches!(
        same.compare(&received[9..]),
        Compare::Matched { .. }
    ));
    // Another value in the row: the row is named, with what came before.
    let other: Vec<u8> = [
        pg(b'C', b"BEGIN\0"),
        pg(b'D', b"\0\x01\0\0\0\x02-7"),
        pg(b'C', b"SELECT 1\0"),
    ]
    .concat();
    assert_eq!(replay.compare(&other), Compare::Differs);
    assert_eq!(
        replay.difference(),
        "expected C(10) D(12) C(13), got C(10) D(12) C(13) at message 2 of 3"
    );
    assert_eq!(replay.completed_before_difference(|k| k == b'C'), 1);
    // An error where a row was: the kinds show it.
    let mut replay = {
        let mut log = TxnLog::new(Some(1 << 20), Framing::Postgres);
        log.open(0, None);
        log.command_done(true);
        log.absorb(&received, received.len() as u64);
        log.start_replay(received.len() as u64)
    };
    let error = [pg(b'C', b"BEGIN\0"), pg(b'E', b"SERROR\0C40001\0\0")].concat();
    replay.compare(&error);
    assert!(replay.is_short() || replay.compare(&[]) == Compare::Differs);
    assert!(
        replay
            .difference()
            .starts_with("expected C(10) D(12) C(13), got C(10) E("),
        "{}",
        replay.difference()
    );
}

#[test]
fn mysql_packets_are_traced_by_their_first_byte() {
    let mut log = TxnLog::new(Some(1 << 20), Framing::Whole);
    log.open(0, None);
    log.command_done(true);
    let ok = [7u8, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0];
    log.absorb(&ok, ok.len() as u64);
    let mut replay = log.start_replay(ok.len() as u64);
    let err = [7u8, 0, 0, 1, 0xff, 0x15, 0x04, b'#', b'4', b'2', b'0'];
    assert_eq!(replay.compare(&err), Compare::Differs);
    assert_eq!(
        replay.difference(),
        "expected 0x00(7), got 0xff(7) at message 1 of 1"
    );
}

#[test]
fn with_debug_a_mismatch_shows_the_bytes_of_the_differing_message() {
    let mut log = TxnLog::new(Some(1 << 20), Framing::Postgres).with_debug(true);
    log.open(0, None);
    log.command_done(true);
    // A ParameterStatus before the row is left out of the comparison but
    // is in the stream: the bytes shown are still the row's.
    let received: Vec<u8> = [pg(b'S', b"a\0b\0"), pg(b'D', b"\0\x01\0\0\0\x02-5")].concat();
    log.absorb(&received, received.len() as u64);
    let mut replay = log.start_replay(received.len() as u64);
    let other = pg(b'D', b"\0\x01\0\0\0\x02-7");
    assert_eq!(replay.compare(&other), Compare::Differs);
    let text = replay.difference();
    assert!(
        text.ends_with(
            "the message received: \"D\\x00\\x00\\x00\\x0c\\x00\\x01\\x00\\x00\\x00\\x02-5\", \
             replayed: \"D\\x00\\x00\\x00\\x0c\\x00\\x01\\x00\\x00\\x00\\x02-7\""
        ),
        "{text}"
    );
}
