//! End-to-end check of the coordination side of the harness: a real
//! three-member etcd (a key written and read through the v3 JSON gateway
//! survives every member being killed and started again) and a two-member
//! Patroni cluster on it (the `app` role logs in, a planned switchover moves
//! the leader, and the new leader takes writes).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fulcrum_testkit::{run_psql, EtcdCluster, PatroniCluster, APP_DB, APP_PASSWORD, APP_USER};

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(text: &str) -> Vec<u8> {
    let digits: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| B64.iter().position(|&d| d == c).expect("a base64 digit") as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0, |n, (i, d)| n | d << (18 - 6 * i));
        out.extend(
            [(n >> 16) as u8, (n >> 8) as u8, n as u8]
                .into_iter()
                .take(chunk.len() - 1),
        );
    }
    out
}

/// One `POST` of a JSON body to etcd's v3 gateway; the response body.
/// A 503 (etcd's "leader changed" while a restarted cluster settles, a
/// retryable error by etcd's own account) is tried again, for up to 5 s.
fn etcd_post(endpoint: &str, path: &str, body: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = TcpStream::connect(endpoint).expect("connect to etcd");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).expect("etcd's answer");
        if out.starts_with("HTTP/1.1 503") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert!(out.starts_with("HTTP/1.1 200"), "POST {path}: {out}");
        return out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    }
}

/// The value of `key` read through `endpoint`, if it has one.
fn etcd_get(endpoint: &str, key: &str) -> Option<String> {
    let body = etcd_post(
        endpoint,
        "/v3/kv/range",
        &format!("{{\"key\":\"{}\"}}", b64_encode(key.as_bytes())),
    );
    let value = body.split("\"value\":\"").nth(1)?.split('"').next()?;
    Some(String::from_utf8(b64_decode(value)).expect("utf-8 value"))
}

#[test]
fn base64_round_trips() {
    for text in ["", "a", "ab", "abc", "abcd", "fulcrum/test-key"] {
        assert_eq!(b64_decode(&b64_encode(text.as_bytes())), text.as_bytes());
    }
    assert_eq!(b64_encode(b"fulcrum"), "ZnVsY3J1bQ==");
}

#[test]
fn etcd_keeps_a_key_across_a_full_stop_and_start() {
    let started = Instant::now();
    let mut etcd = EtcdCluster::start(3).expect("etcd cluster");
    let endpoints = etcd.endpoints();
    assert_eq!(endpoints.len(), 3);
    eprintln!("etcd: 3 members up in {:?}", started.elapsed());

    etcd_post(
        &endpoints[0],
        "/v3/kv/put",
        &format!(
            "{{\"key\":\"{}\",\"value\":\"{}\"}}",
            b64_encode(b"fulcrum/test-key"),
            b64_encode(b"hello etcd")
        ),
    );
    // Written through one member, read through every one.
    for e in &endpoints {
        assert_eq!(
            etcd_get(e, "fulcrum/test-key").as_deref(),
            Some("hello etcd"),
            "read through {e}"
        );
    }

    etcd.stop_all();
    assert!(
        TcpStream::connect(&endpoints[1]).is_err(),
        "a killed member still answers"
    );
    let restart = Instant::now();
    etcd.start_all().expect("etcd restarted");
    eprintln!("etcd: restarted in {:?}", restart.elapsed());
    assert_eq!(etcd.endpoints(), endpoints, "same ports after a restart");
    assert_eq!(
        etcd_get(&endpoints[2], "fulcrum/test-key").as_deref(),
        Some("hello etcd")
    );

    // One member down leaves a quorum; it rejoins on its own data.
    etcd.kill_member(0);
    assert_eq!(
        etcd_get(&endpoints[1], "fulcrum/test-key").as_deref(),
        Some("hello etcd")
    );
    etcd.start_member(0).expect("member 0 back");
    assert_eq!(
        etcd_get(&endpoints[0], "fulcrum/test-key").as_deref(),
        Some("hello etcd")
    );
    eprintln!("etcd test: {:?}", started.elapsed());
}

#[test]
fn patroni_switches_over_to_a_writable_leader() {
    let started = Instant::now();
    let etcd = EtcdCluster::start(3).expect("etcd cluster");
    let pat = PatroniCluster::start(&etcd, 2).expect("patroni cluster");
    eprintln!("patroni: 2 members up in {:?}", started.elapsed());

    let addresses = pat.pg_addresses();
    assert_eq!(addresses.len(), 2);
    assert_eq!(pat.api_endpoints().len(), 2);
    let leader = pat.leader().expect("a running leader");
    let other = 1 - leader;
    // Streaming as soon as start() returns: a replica that only shows
    // `running` in `GET /cluster` may not stream yet, and a switchover to it
    // would drop the leader's last commits.
    assert_eq!(
        pat.psql(
            leader,
            "SELECT count(*) FROM pg_stat_replication \
             WHERE state = 'streaming' AND application_name <> 'pg_basebackup'"
        )
        .unwrap(),
        "1",
        "PatroniCluster::start returned before the replica streams"
    );

    // The app role logs in with its SCRAM password, on the leader and on
    // the streaming replica alike.
    for a in &addresses {
        assert_eq!(
            run_psql(a, APP_USER, APP_PASSWORD, APP_DB, "SELECT session_user").unwrap(),
            APP_USER,
            "login as {APP_USER} on {a}"
        );
    }
    assert_eq!(pat.psql(leader, "SELECT pg_is_in_recovery()").unwrap(), "f");
    assert_eq!(pat.psql(other, "SELECT pg_is_in_recovery()").unwrap(), "t");
    pat.psql(leader, "CREATE TABLE before_switchover (id int)")
        .unwrap();

    let switch = Instant::now();
    pat.switchover(other, Duration::from_secs(30))
        .expect("switchover");
    eprintln!("patroni: switchover in {:?}", switch.elapsed());
    assert_eq!(pat.leader(), Some(other));
    assert_eq!(pat.psql(other, "SELECT pg_is_in_recovery()").unwrap(), "f");
    // The new leader takes writes, as app, on what was written before.
    run_psql(
        &addresses[other],
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "CREATE TABLE after_switchover (id int); INSERT INTO after_switchover VALUES (1)",
    )
    .expect("a write on the new leader");
    assert_eq!(
        pat.psql(other, "SELECT count(*) FROM before_switchover")
            .unwrap(),
        "0"
    );
    // The demoted leader rejoins as a replica of the new one.
    let rejoin = Instant::now();
    while pat
        .psql(leader, "SELECT pg_is_in_recovery()")
        .map_or(true, |r| r != "t")
    {
        assert!(
            rejoin.elapsed() < Duration::from_secs(30),
            "the old leader never came back as a replica"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "patroni: old leader a replica {:?} after the switchover",
        rejoin.elapsed()
    );
    eprintln!("patroni test: {:?}", started.elapsed());
}
