//! The daemon-process helper, exercised with a stand-in daemon (a short perl
//! script with the same command line: `--config FILE`, binds every `listen`),
//! so these tests do not depend on the real daemon being built.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fulcrum_testkit::{free_port, FulcrumProcess, Signal, TestkitError};

const FAKE_DAEMON: &str = r#"#!/usr/bin/perl
use strict;
use IO::Socket::INET;
unlink $0;    # written per test by fake_daemon(); perl has read it already
$| = 1;
my ($flag, $config) = @ARGV;
die "usage: --config FILE\n" unless $flag eq '--config';
open(my $fh, '<', $config) or die "cannot read $config: $!\n";
my @lines = <$fh>;
if (grep { /^bogus/ } @lines) { print STDERR "$config:1: bogus: unknown key\n"; exit 2; }
select(undef, undef, undef, 0.3);    # listen late, like a daemon warming up
my @socks;
for (@lines) {
    next unless /^\s*listen\s*=\s*"([^"]+)"/;
    next if grep { /^# deaf/ } @lines;
    push @socks, IO::Socket::INET->new(LocalAddr => $1, Listen => 5, ReuseAddr => 1)
        or die "bind $1: $!\n";
}
$SIG{HUP} = sub { print "reloading configuration\n" };
print "fake fulcrum ready\n";
sleep 1 while 1;
"#;

/// Writes a fresh copy of the stand-in daemon (it deletes itself when run).
fn fake_daemon() -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("fake-fulcrum-{}-{n}.pl", std::process::id()));
    std::fs::write(&path, FAKE_DAEMON).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn start(config: &str) -> Result<FulcrumProcess, TestkitError> {
    let process = FulcrumProcess::spawn_with(&fake_daemon(), config, &[])?;
    process.wait_listening(Duration::from_secs(10))?;
    Ok(process)
}

#[test]
fn daemon_is_started_waited_for_signalled_and_killed_on_drop() {
    let (a, b) = (free_port(), free_port());
    let config = format!(
        "[fulcrum]\nadmin = \"127.0.0.1:1\"\n\n[[cluster]]\nlisten = \"127.0.0.1:{a}\"\n\n\
         [[cluster]]\n  listen = \"127.0.0.1:{b}\"\n"
    );
    let daemon = start(&config).unwrap();
    for port in [a, b] {
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("listening after start()");
    }
    assert_eq!(
        std::fs::read_to_string(daemon.config_path()).unwrap(),
        config
    );
    assert_eq!(
        daemon.listen_addrs(),
        [format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}")]
    );
    assert!(daemon.log_contents().contains("fake fulcrum ready"));

    daemon.signal(Signal::Hup).unwrap();
    daemon
        .wait_for_log("reloading configuration", Duration::from_secs(5))
        .unwrap();
    assert_eq!(daemon.wait_exit(Duration::from_millis(100)), None);

    let (pid, dir) = (daemon.pid(), daemon.dir().to_path_buf());
    drop(daemon);
    assert!(
        !PathBuf::from(format!("/proc/{pid}")).exists(),
        "pid {pid} still exists"
    );
    assert!(!dir.exists());
}

#[test]
fn sigterm_ends_the_daemon_and_later_signals_are_refused() {
    let port = free_port();
    let daemon = start(&format!("listen = \"127.0.0.1:{port}\"\n")).unwrap();
    daemon.signal(Signal::Term).unwrap();
    let status = daemon
        .wait_exit(Duration::from_secs(5))
        .expect("exits on SIGTERM");
    assert_eq!(status.signal(), Some(15), "{status}"); // SIGTERM
    let err = daemon.signal(Signal::Term).unwrap_err().to_string();
    assert!(err.contains("already exited"), "{err}");
}

#[test]
fn a_daemon_that_exits_at_start_is_reported_with_its_log() {
    let err = start(&format!(
        "bogus = 1\nlisten = \"127.0.0.1:{}\"\n",
        free_port()
    ))
    .unwrap_err();
    assert!(matches!(err, TestkitError::FulcrumStart { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("exited with exit status: 2") && msg.contains("bogus: unknown key"),
        "{msg}"
    );
}

#[test]
fn a_daemon_that_never_listens_times_out_with_its_log() {
    let config = format!("# deaf\nlisten = \"127.0.0.1:{}\"\n", free_port());
    let daemon = FulcrumProcess::spawn_with(&fake_daemon(), &config, &[]).unwrap();
    // The fake daemon has started (its log says so) before the wait that
    // must time out: on a busy machine perl alone may take longer than it.
    let started = std::time::Instant::now();
    while !daemon.log_contents().contains("fake fulcrum ready") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the fake daemon never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = match daemon.wait_listening(Duration::from_millis(800)) {
        Err(e) => e.to_string(),
        Ok(()) => {
            let ss = std::process::Command::new("ss")
                .arg("-ltnp")
                .output()
                .unwrap();
            panic!(
                "{:?} accepted connections although the daemon binds nothing:\n{}",
                daemon.listen_addrs(),
                String::from_utf8_lossy(&ss.stdout)
            );
        }
    };
    assert!(
        err.contains("not listening on 127.0.0.1:") && err.contains("fake fulcrum ready"),
        "{err}"
    );
}

#[test]
fn missing_daemon_binary_says_how_to_build_it() {
    let err = FulcrumProcess::spawn_with(Path::new("/nonexistent/fulcrum"), "", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("cargo build -p fulcrum"), "{err}");
}
