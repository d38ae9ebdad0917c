//! The reply queue, message by message: what is shown, what is swallowed,
//! what ends where, and the answers Fulcrum gives in the server's place.

use super::*;

#[test]
fn a_swallowed_query_shows_only_errors_and_notices() {
    let mut q = Expectations::default();
    q.push(Expect::SwallowQuery);
    q.push(Expect::Query(vec![], None));
    assert_eq!(q.on_server(b'C', b"BEGIN\0").0, Step::Drop);
    assert_eq!(q.on_server(b'N', b"").0, Step::Forward);
    let (step, fx) = q.on_server(b'Z', b"T");
    assert_eq!((step, fx.ready), (Step::Drop, None));
    assert_eq!(q.on_server(b'C', b"SELECT 1\0").0, Step::Forward);
    let (_, fx) = q.on_server(b'Z', b"T");
    assert_eq!(fx.ready, Some(b'T'));
    assert!(q.is_empty());
}

/// A DataRow body with one text column.
fn row(value: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 1];
    b.extend_from_slice(&(value.len() as i32).to_be_bytes());
    b.extend_from_slice(value);
    b
}

#[test]
fn the_position_query_is_hidden_and_its_lsn_read() {
    let mut q = Expectations::default();
    q.push(Expect::Position);
    assert!(q.only_position());
    for (tag, body) in [
        (b'T', &b"..."[..]),
        (b'D', &row(b"0/3062A10")),
        (b'C', b"SELECT 1\0"),
    ] {
        let (step, fx) = q.on_server(tag, body);
        assert_eq!((step, fx.position), (Step::Drop, None));
    }
    let (step, fx) = q.on_server(b'Z', b"I");
    assert_eq!(
        (step, fx.ready),
        (Step::Drop, None),
        "no ReadyForQuery for the client"
    );
    assert_eq!(fx.position, Some(Some(0x3062A10)));
    assert!(q.is_empty());
}

#[test]
fn the_commit_id_query_is_hidden_and_its_id_read() {
    let mut q = Expectations::default();
    q.push(Expect::CommitId { in_batch: false });
    q.push(Expect::Query(vec![], None));
    assert_eq!(q.on_server(b'T', b"...").0, Step::Drop);
    assert_eq!(q.on_server(b'D', &row(b"7421")).0, Step::Drop);
    assert_eq!(q.on_server(b'C', b"SELECT 1\0").0, Step::Drop);
    let (step, fx) = q.on_server(b'Z', b"T");
    assert_eq!((step, fx.ready), (Step::Drop, None), "not the client's");
    assert_eq!(fx.commit_id, Some(CommitId::Id(7421)));
    assert_eq!(q.on_server(b'C', b"COMMIT\0").0, Step::Forward);
    let (_, fx) = q.on_server(b'Z', b"I");
    assert_eq!(fx.ready, Some(b'I'));
    assert!(q.is_empty());
    // Asked behind a statement that ended the transaction: no id.
    q.push(Expect::CommitId { in_batch: false });
    q.on_server(b'D', &row(b"7422"));
    let (_, fx) = q.on_server(b'Z', b"I");
    assert_eq!(fx.commit_id, Some(CommitId::Unknown));
    // Behind a failed statement, "transaction aborted" is not news.
    q.push(Expect::CommitId { in_batch: false });
    assert_eq!(q.on_server(b'E', b"SERROR\0C25P02\0\0").0, Step::Drop);
    let (_, fx) = q.on_server(b'Z', b"E");
    assert_eq!(fx.commit_id, Some(CommitId::Unknown));
    // A transaction that wrote nothing has no id: a NULL column.
    q.push(Expect::CommitId { in_batch: false });
    q.on_server(b'D', &[0, 1, 0xff, 0xff, 0xff, 0xff]);
    let (_, fx) = q.on_server(b'Z', b"T");
    assert_eq!(fx.commit_id, Some(CommitId::NothingWritten));
}

#[test]
fn the_commit_id_asked_in_a_clients_batch_ends_at_its_close() {
    // Client: Bind, Execute, [Fulcrum: Parse, Bind, Execute, Close], Sync.
    let mut q = Expectations::default();
    q.push(Expect::Bind(None));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::SwallowParse(Some("fulcrum_9".into())));
    q.push(Expect::CommitId { in_batch: true });
    q.push(Expect::Sync);
    assert_eq!(q.on_server(b'2', b"").0, Step::Forward);
    assert_eq!(q.on_server(b'C', b"UPDATE 1\0").0, Step::Forward);
    assert_eq!(q.on_server(b'1', b"").0, Step::Drop);
    for (tag, body) in [
        (b'2', &b""[..]),
        (b'D', &row(b"880")),
        (b'C', b"SELECT 1\0"),
    ] {
        assert_eq!(q.on_server(tag, body).0, Step::Drop);
    }
    let (step, fx) = q.on_server(b'3', b"");
    assert_eq!((step, fx.commit_id), (Step::Drop, Some(CommitId::Id(880))));
    let (step, fx) = q.on_server(b'Z', b"T");
    assert_eq!((step, fx.ready), (Step::Forward, Some(b'T')));
    assert!(q.is_empty());
    // The client's statement failed: the server skips Fulcrum's part too.
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::CommitId { in_batch: true });
    q.push(Expect::Sync);
    let (step, fx) = q.on_server(b'E', b"SERROR\0C23505\0\0");
    assert_eq!((step, fx.skipped_to_sync), (Step::Forward, true));
    let (_, fx) = q.on_server(b'Z', b"E");
    assert_eq!((fx.ready, fx.commit_id), (Some(b'E'), None));
    assert!(q.is_empty());
}

#[test]
fn a_failed_parse_of_the_question_skips_only_to_its_own_sync() {
    let mut q = Expectations::default();
    q.push(Expect::SwallowParse(Some("fulcrum_9".into())));
    q.push(Expect::CommitId { in_batch: false });
    q.push(Expect::Query(vec![], None));
    q.on_server(b'E', b"SERROR\0C42883\0\0");
    let (step, fx) = q.on_server(b'Z', b"T");
    assert_eq!(
        (step, fx.ready, fx.commit_id),
        (Step::Drop, None, Some(CommitId::Unknown))
    );
    assert_eq!(q.on_server(b'C', b"INSERT 0 1\0").0, Step::Forward);
    let (_, fx) = q.on_server(b'Z', b"T");
    assert_eq!(fx.ready, Some(b'T'), "the client's Query ends at its own");
}

#[test]
fn a_commit_that_committed_is_answered_as_the_server_would_have() {
    // pgbench -M prepared: Bind, Describe portal, Execute, Sync.
    let mut q = Expectations::default();
    q.push(Expect::Bind(None));
    q.push(Expect::Describe(None, b'P'));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    let mut out = BytesMut::new();
    assert!(q.answer_commit(&mut out, std::time::Instant::now()));
    assert_eq!(
        &out[..],
        b"2\0\0\0\x04n\0\0\0\x04C\0\0\0\x0bCOMMIT\0Z\0\0\0\x05I"
    );
    assert!(q.is_empty());
    // A simple query; a statement describe gets its parameters too.
    q.push(Expect::Query(vec![], None));
    let mut out = BytesMut::new();
    assert!(q.answer_commit(&mut out, std::time::Instant::now()));
    assert_eq!(&out[..], b"C\0\0\0\x0bCOMMIT\0Z\0\0\0\x05I");
    q.push(Expect::Parse(None));
    q.push(Expect::Describe(None, b'S'));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    let mut out = BytesMut::new();
    assert!(q.answer_commit(&mut out, std::time::Instant::now()));
    assert!(out.starts_with(b"1\0\0\0\x04t\0\0\0\x06\0\0n\0\0\0\x04C"));
}

#[test]
fn only_a_lone_commit_is_answered() {
    let mut q = Expectations::default();
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    let mut out = BytesMut::new();
    assert!(
        !q.answer_commit(&mut out, std::time::Instant::now()),
        "two statements in flight"
    );
    assert!(out.is_empty());
    assert!(!q.is_empty(), "left as it was");
}

#[test]
fn a_failed_position_query_gives_no_position() {
    let mut q = Expectations::default();
    q.push(Expect::Position);
    assert_eq!(q.on_server(b'E', b"SERROR\0").0, Step::Drop, "not shown");
    let (_, fx) = q.on_server(b'Z', b"I");
    assert_eq!(fx.position, Some(None));
}

#[test]
fn syncs_sent_during_extended_copy_in_owe_no_reply() {
    // Client: Bind, Execute, Sync, CopyData, CopyDone, Sync (tokio-postgres' copy_in).
    let mut q = Expectations::default();
    q.push(Expect::Bind(None));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    q.on_server(b'2', b"");
    let (_, fx) = q.on_server(b'G', b"");
    assert_eq!(fx.ignored_syncs, 1);
    assert!(q.sync_is_ignored());
    q.client_copy_end();
    assert!(!q.sync_is_ignored());
    q.push(Expect::Sync);
    q.on_server(b'C', b"");
    let (_, fx) = q.on_server(b'Z', b"I");
    assert_eq!(fx.ready, Some(b'I'));
    assert!(q.is_empty());
}

#[test]
fn copy_end_pipelined_before_copy_in_response_keeps_the_later_sync() {
    let mut q = Expectations::default();
    q.push(Expect::Bind(None));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    q.client_copy_end();
    q.push(Expect::Sync);
    q.on_server(b'2', b"");
    let (_, fx) = q.on_server(b'G', b"");
    assert_eq!(fx.ignored_syncs, 1);
    assert!(!q.sync_is_ignored());
    q.on_server(b'C', b"");
    q.on_server(b'Z', b"I");
    let mut out = BytesMut::new();
    q.drain_synthetic(&mut out, b'I');
    assert!(q.is_empty());
}

fn synthetic_parse_complete() -> Expect {
    let mut b = BytesMut::new();
    backend_msg::parse_complete(&mut b);
    Expect::Synthetic(b.freeze())
}

#[test]
fn injected_parse_is_swallowed_and_synthetic_emitted_in_order() {
    let mut q = Expectations::default();
    let name: Arc<str> = "fulcrum_1".into();
    // Client: Parse(s1) [already prepared -> synthetic], Bind(s1) [server lacks it -> injected], Execute, Sync.
    q.push(synthetic_parse_complete());
    q.push(Expect::SwallowParse(Some(name.clone())));
    q.push(Expect::Bind(None));
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    let mut out = BytesMut::new();
    q.drain_synthetic(&mut out, b'I');
    assert_eq!(&out[..], b"1\0\0\0\x04");
    let (s, fx) = q.on_server(b'1', b"");
    assert_eq!(s, Step::Drop);
    assert_eq!(fx.prepared, Some(name));
    assert_eq!(q.on_server(b'2', b"").0, Step::Forward);
    assert_eq!(q.on_server(b'D', b"").0, Step::Forward);
    assert_eq!(q.on_server(b'C', b"").0, Step::Forward);
    let (_, fx) = q.on_server(b'Z', b"I");
    assert_eq!(fx.ready, Some(b'I'));
    assert!(q.is_empty());
}

#[test]
fn error_skips_to_sync_and_drops_synthetics() {
    let mut q = Expectations::default();
    q.push(Expect::Parse(None));
    q.push(Expect::Bind(None));
    q.push(synthetic_parse_complete());
    q.push(Expect::Execute(vec![], None));
    q.push(Expect::Sync);
    let (s, fx) = q.on_server(b'E', b"");
    assert_eq!(s, Step::Forward);
    assert!(fx.skipped_to_sync);
    let mut out = BytesMut::new();
    q.drain_synthetic(&mut out, b'I');
    assert!(out.is_empty(), "the server would have skipped that Parse");
    q.on_server(b'Z', b"I");
    assert!(q.is_empty());
}

#[test]
fn query_ops_apply_only_without_error() {
    let mut q = Expectations::default();
    let op = Effect::ResetAll;
    q.push(Expect::Query(vec![op.clone()], None));
    q.on_server(b'C', b"");
    q.on_server(b'Z', b"I");
    assert_eq!(q.take_batch_ops(), vec![op.clone()]);
    q.push(Expect::Query(vec![op], None));
    q.on_server(b'E', b"");
    q.on_server(b'Z', b"I");
    assert!(q.take_batch_ops().is_empty());
}

#[test]
fn pipelined_queries_end_one_at_a_time() {
    let mut q = Expectations::default();
    q.push(Expect::Query(vec![], None));
    q.push(Expect::Query(vec![], None));
    q.on_server(b'Z', b"I");
    assert!(!q.is_empty());
    q.on_server(b'Z', b"I");
    assert!(q.is_empty());
}

#[test]
fn synthetic_query_reports_failed_transaction() {
    let mut q = Expectations::default();
    q.push(Expect::SyntheticQuery("DEALLOCATE"));
    let mut out = BytesMut::new();
    assert_eq!(q.drain_synthetic(&mut out, b'E'), Some(b'E'));
    assert_eq!(out[0], b'E');
    let mut out = BytesMut::new();
    q.push(Expect::SyntheticQuery("DEALLOCATE"));
    assert_eq!(q.drain_synthetic(&mut out, b'I'), Some(b'I'));
    assert_eq!(&out[..], b"C\0\0\0\x0fDEALLOCATE\0Z\0\0\0\x05I");
}

/// What `tag_rows` read before it was written by hand: the last word of
/// the tag, parsed as `u64::from_str` does.
fn tag_rows_by_parse(tag: u8, body: &[u8]) -> u64 {
    if tag != b'C' {
        return 0;
    }
    let text = body.split(|&b| b == 0).next().unwrap_or_default();
    text.rsplit(|&b| b == b' ')
        .next()
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn tag_rows_reads_the_last_number_of_a_command_tag() {
    let cases: [(&[u8], u64); 16] = [
        (b"SELECT 1\0", 1),
        (b"INSERT 0 25\0", 25),
        (b"UPDATE 3\0", 3),
        (b"DELETE 0\0", 0),
        (b"COPY 18446744073709551615\0", u64::MAX),
        (b"COPY 18446744073709551616\0", 0),
        (b"BEGIN\0", 0),
        (b"SELECT \0", 0),
        (b"SELECT +7\0", 7),
        (b"SELECT +\0", 0),
        (b"SELECT -1\0", 0),
        (b"SELECT 1x\0", 0),
        (b"42\0", 42),
        (b"SELECT 5", 5),
        (b"\0SELECT 5", 0),
        (b"SELECT \xff1\0", 0),
    ];
    for (body, rows) in cases {
        assert_eq!(
            tag_rows(b'C', body),
            rows,
            "{:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(tag_rows(b'C', body), tag_rows_by_parse(b'C', body));
    }
    assert_eq!(tag_rows(b'I', b"SELECT 1\0"), 0);
}
