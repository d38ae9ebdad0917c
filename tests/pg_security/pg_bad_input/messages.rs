//! Bad input after login: zero, negative, oversized and unknown messages, a
//! statement opening with a multibyte character, a 50 MB nested query, a
//! declared length that arrives slowly, and clients preparing or setting
//! without end.

use std::time::Duration;

use fulcrum_suite::pg_primary;
use fulcrum_testkit::{FulcrumProcess, APP_DB, APP_PASSWORD, APP_USER};

use super::helpers::{
    addr, assert_unharmed, bystander, conn_string, connect, db_error, header, query, rows,
    select_1, start_fulcrum, Raw, IO_TIMEOUT, PROTOCOL_VIOLATION, SCRAM, TRUST,
};

/// SQL whose Query message declares exactly `len` bytes (a body of `len - 4`);
/// the query returns one text column of `len - 15` characters.
fn sql_of_length(len: usize) -> String {
    let filler = len - 4 - "SELECT '';".len() - 1;
    let sql = format!("SELECT '{}';", "x".repeat(filler));
    assert_eq!(query(&sql).len(), 1 + len);
    sql
}

// ---- after login ---------------------------------------------------------------------

async fn assert_bad_message_after_login_is_fatal(message: &[u8], expect: &str) {
    let bystander = bystander(&TRUST).await;
    let (mut raw, _) = Raw::login(&addr(&TRUST)).await;
    raw.send(message).await;
    let text = raw.expect_fatal(PROTOCOL_VIOLATION).await;
    assert!(text.contains(expect), "want {expect:?} in {text:?}");
    assert_unharmed(&TRUST, &bystander).await;
}

#[tokio::test]
async fn zero_length_message_after_login_gets_fatal_08p01() {
    assert_bad_message_after_login_is_fatal(&header(b'Q', 0), "invalid message length 0").await;
}

#[tokio::test]
async fn negative_length_message_after_login_gets_fatal_08p01() {
    assert_bad_message_after_login_is_fatal(&header(b'Q', -1), "invalid message length -1").await;
}

#[tokio::test]
async fn message_over_max_message_size_gets_fatal_08p01() {
    // max_message_size = 1kB: a body of 1024 bytes (declared length 1028) is the largest allowed.
    let (mut raw, _) = Raw::login(&addr(&TRUST)).await;
    let at_limit = raw.query(&sql_of_length(1028)).await;
    assert_eq!(rows(&at_limit)[0].len(), 1028 - 15);

    assert_bad_message_after_login_is_fatal(
        &query(&sql_of_length(1029)),
        "over the limit of 1024 bytes",
    )
    .await;
    assert_bad_message_after_login_is_fatal(
        &query(&sql_of_length(2048)),
        "over the limit of 1024 bytes",
    )
    .await;
}

#[tokio::test]
async fn unknown_message_type_gets_fatal_08p01() {
    let mut message = header(b'@', 8);
    message.extend_from_slice(b"junk");
    assert_bad_message_after_login_is_fatal(&message, "invalid frontend message type 64").await;
}

/// A statement whose second part opens with a multi-byte character: read
/// for its session effects, it once panicked the client's task (a byte
/// slice inside `é`). The server's own syntax error comes back instead.
#[tokio::test]
async fn a_statement_opening_with_a_multibyte_character_gets_the_servers_error() {
    let bystander = bystander(&SCRAM).await;
    let client = connect(&conn_string(&addr(&SCRAM), APP_USER, APP_PASSWORD, APP_DB))
        .await
        .expect("login");
    for sql in ["SELECT 1; é", "é; SET application_name = 'x'"] {
        let r = tokio::time::timeout(IO_TIMEOUT, client.batch_execute(sql))
            .await
            .unwrap_or_else(|_| panic!("{sql:?} hung"));
        let e = r.expect_err("a syntax error");
        assert_eq!(db_error(&e).0, "42601", "{sql:?}: {e:?}");
        assert_eq!(select_1(&client).await.expect("still usable"), 1);
    }
    assert_unharmed(&SCRAM, &bystander).await;
}

/// Peak resident memory (VmHWM) and resident memory (VmRSS) of a process, in kB.
fn memory_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// A 50 MB nested query is not handed to the SQL parser (which once took
/// 1.75 GB for 20 MB): it goes to the primary by `default_route`, the
/// server answers it, Fulcrum's peak memory grows by less than 100 MB, and
/// another client is answered all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mb_nested_query_is_not_parsed_and_harms_no_one() {
    let fulcrum = start_fulcrum(&pg_primary().primary().addr(), "trust", "");
    let bystander = bystander(&fulcrum).await;
    let client = connect(&conn_string(
        &addr(&fulcrum),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
    ))
    .await
    .expect("login");
    let depth = 25 * 1024 * 1024;
    let mut sql = String::with_capacity(2 * depth + 16);
    sql.push_str("SELECT ");
    sql.extend(std::iter::repeat_n('(', depth));
    sql.push('1');
    sql.extend(std::iter::repeat_n(')', depth));
    let (_, before) = memory_kb(fulcrum.pid());
    let done = std::sync::atomic::AtomicBool::new(false);
    let huge = async {
        let r = tokio::time::timeout(Duration::from_secs(120), client.simple_query(&sql))
            .await
            .expect("the 50 MB query got no answer in 120 s");
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let meanwhile = async {
        let mut answered = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            // Each answered within IO_TIMEOUT (select_1's bound).
            assert_eq!(select_1(&bystander).await.expect("bystander"), 1);
            answered += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        answered
    };
    let (r, answered) = tokio::join!(huge, meanwhile);
    // PostgreSQL refuses that depth itself (stack depth / parser stack): a
    // clear error from the server, not from Fulcrum's parser.
    match r {
        Ok(_) => {}
        Err(e) => {
            let code = db_error(&e).0;
            assert!(
                matches!(code.as_str(), "54001" | "54000" | "53200" | "42601"),
                "{e:?}"
            );
        }
    }
    assert!(
        answered > 0,
        "the bystander was answered while the query ran"
    );
    let (peak, _) = memory_kb(fulcrum.pid());
    assert!(
        peak.saturating_sub(before) < 100 * 1024,
        "peak RSS grew from {before} kB to {peak} kB"
    );
    assert_eq!(select_1(&client).await.expect("the sender still works"), 1);
    assert_unharmed(&fulcrum, &bystander).await;
}

/// Fulcrum's virtual memory size in bytes (`VmSize` in /proc).
fn vm_size(fulcrum: &FulcrumProcess) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", fulcrum.pid())).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmSize");
    kb * 1024
}

/// A 5-byte header declaring a large message reserves nothing until the
/// bytes come: 16 clients each announcing 200 MB (under a 256 MiB
/// `max_message_size`) and sending 4 bytes of it do not make Fulcrum ask
/// the kernel for 3 GB.
#[tokio::test]
async fn a_declared_length_reserves_memory_only_as_bytes_arrive() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "trust",
        "max_message_size = \"256MB\"\n",
    );
    let bystander = bystander(&fulcrum).await;
    let before = vm_size(&fulcrum);
    let mut held = Vec::new();
    for _ in 0..16 {
        let (mut raw, _) = Raw::login(&addr(&fulcrum)).await;
        let mut message = header(b'Q', 200_000_000);
        message.extend_from_slice(b"SELE");
        raw.send(&message).await;
        held.push(raw);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = vm_size(&fulcrum).saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "16 announced 200 MB messages grew Fulcrum's address space by {} MB",
        grown >> 20
    );
    drop(held);
    assert_unharmed(&fulcrum, &bystander).await;
}

/// One client cannot grow Fulcrum without end by preparing fresh names:
/// past `max_client_prepared_statements` its session ends with 54000, and
/// other clients go on. Statements it closed do not count.
#[tokio::test]
async fn a_client_preparing_without_end_is_stopped_at_its_cap() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "scram-sha-256",
        "max_client_prepared_statements = 5\n",
    );
    let bystander = bystander(&fulcrum).await;
    let client = connect(&conn_string(
        &addr(&fulcrum),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
    ))
    .await
    .expect("login");
    // Closed statements (dropped: tokio-postgres sends Close) do not count.
    for i in 0..10 {
        let s = client
            .prepare(&format!("SELECT {i}"))
            .await
            .expect("prepare");
        drop(s);
    }
    let mut kept = Vec::new();
    for i in 0..5 {
        kept.push(
            client
                .prepare(&format!("SELECT {i} + 1"))
                .await
                .expect("within the cap"),
        );
    }
    let err = client
        .prepare("SELECT 'one too many'")
        .await
        .expect_err("over the cap");
    assert_eq!(err.code().map(|c| c.code()), Some("54000"), "{err:?}");
    assert_unharmed(&fulcrum, &bystander).await;
}

/// The same for session settings (transaction pooling replays each on every
/// server connection the client uses): past `max_client_settings` distinct
/// ones the session ends with 54000 before the SET reaches a server; a
/// setting already tracked may change, RESET frees one, and other clients
/// go on.
#[tokio::test]
async fn a_client_setting_without_end_is_stopped_at_its_cap() {
    let fulcrum = start_fulcrum(
        &pg_primary().primary().addr(),
        "scram-sha-256",
        "max_client_settings = 5\n",
    );
    let bystander = bystander(&fulcrum).await;
    let client = connect(&conn_string(
        &addr(&fulcrum),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
    ))
    .await
    .expect("login");
    for i in 0..5 {
        client
            .batch_execute(&format!("SET app.k{i} = '{i}'"))
            .await
            .expect("within the cap");
    }
    client
        .batch_execute("SET app.k0 = 'changed'; RESET app.k1")
        .await
        .expect("a tracked setting changes, RESET frees one");
    client
        .batch_execute("SELECT set_config('app.k5', 'x', false)")
        .await
        .expect("the freed place");
    let err = client
        .batch_execute("SET app.k6 = 'one too many'")
        .await
        .expect_err("over the cap");
    assert_eq!(err.code().map(|c| c.code()), Some("54000"), "{err:?}");
    assert_unharmed(&fulcrum, &bystander).await;
}
