//! The README's demo command as a user runs it: the binary shows progress
//! while it builds its cluster, says "listening" only once Fulcrum really
//! listens (a client connects at once), prints the admin console, metrics
//! and status page addresses it serves (each answers), and on Ctrl-C
//! (SIGINT) stops and removes its cluster.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fulcrum_testkit::{run_psql, APP_DB, APP_PASSWORD, APP_USER};

/// The number after `prefix` in `line`.
fn port_after(line: &str, prefix: &str) -> Option<u16> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn the_demo_builds_serves_tells_where_and_stops_on_ctrl_c() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fulcrum-demo"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo starts");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    // Up to the end of the announcement.
    while !lines.iter().any(|l| l.starts_with("Ctrl-C stops Fulcrum")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the demo did not announce itself in 180 s:\n{}",
                    lines.join("\n")
                );
            }
        }
    }
    let text = lines.join("\n");
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{text}"))
    };
    let listening = at("Fulcrum is listening on 127.0.0.1:");
    assert!(at("[1/3] building") < at("[2/3] cluster up"), "{text}");
    assert!(at("[3/3] starting Fulcrum") < listening, "{text}");
    let port = port_after(&lines[listening], "127.0.0.1:").expect("the port");
    // Said only once it listens: a client gets in at once.
    let one = run_psql(
        &format!("127.0.0.1:{port}"),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT 40 + 2",
    )
    .expect("a client through the demo's Fulcrum");
    assert_eq!(one, "42");
    // The admin console it prints.
    let admin = port_after(&lines[at("-U ops fulcrum")], "-p ").expect("the console's port");
    let help = run_psql(
        &format!("127.0.0.1:{admin}"),
        "ops",
        "ops-secret",
        "fulcrum",
        "SHOW HELP",
    )
    .expect("the console it printed");
    assert!(help.contains("SHOW"), "{help}");
    // The metrics and status page addresses it prints.
    let metrics_line = &lines[at("/metrics")];
    let metrics = port_after(metrics_line, "127.0.0.1:").expect("the metrics port");
    let status_line = &lines[at("/?key=")];
    let key = status_line
        .rsplit("key=")
        .next()
        .expect("the key")
        .trim()
        .to_owned();
    let get = |path: &str| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics)).expect("metrics port");
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(get("/metrics").contains("fulcrum_build_info"));
    let page = get(&format!("/?key={key}"));
    assert!(
        page.starts_with("HTTP/1.1 200") || page.starts_with("HTTP/1.0 200"),
        "{page}"
    );
    // Ctrl-C: Fulcrum stops and the cluster goes.
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let stopped = Instant::now() + Duration::from_secs(60);
    let mut said_stopped = false;
    while Instant::now() < stopped {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => said_stopped |= line.contains("stopped; the cluster is removed"),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    let exited = child.wait().expect("the demo exits");
    let _ = reader.join();
    assert!(said_stopped, "the demo said it removed its cluster");
    assert!(exited.success(), "{exited}");
    assert!(
        run_psql(
            &format!("127.0.0.1:{port}"),
            APP_USER,
            APP_PASSWORD,
            APP_DB,
            "SELECT 1"
        )
        .is_err(),
        "nothing listens any more"
    );
}
