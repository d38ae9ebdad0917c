//! The binary as an operator and systemd meet it: `--version`, shell
//! completions and the man page generated from the CLI definitions, the
//! default config path, and the readiness protocol of `Type=notify`
//! (`READY=1` once the listeners are open, `STOPPING=1` on SIGTERM),
//! received on a datagram socket as systemd would.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, fulcrum_bin, wait_for_tcp};

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(fulcrum_bin())
        .args(args)
        .output()
        .expect("fulcrum");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_completions_and_man_page() {
    let (ok, out, _) = run(&["--version"]);
    assert!(ok && out.starts_with("fulcrum "), "{out}");
    let (ok, out, _) = run(&["completions", "bash"]);
    assert!(ok && out.contains("complete -F _fulcrum"), "{out}");
    assert!(
        out.contains("check") && out.contains("manpage"),
        "subcommands completed"
    );
    let (ok, out, _) = run(&["completions", "zsh"]);
    assert!(ok && out.starts_with("#compdef fulcrum"), "{out}");
    let (ok, out, _) = run(&["manpage"]);
    assert!(
        ok && out.contains(".TH fulcrum 1") && out.contains("\\-\\-config"),
        "{out}"
    );
    let (ok, _, err) = run(&["completions", "tcsh"]);
    assert!(!ok && err.contains("invalid value"), "{err}");
}

#[test]
fn without_config_the_default_path_is_named() {
    let (ok, _, err) = run(&["check"]);
    assert!(!ok);
    assert!(err.contains("/etc/fulcrum/fulcrum.toml"), "{err}");
}

/// The next datagram on `socket`, within `timeout`.
fn next(socket: &UnixDatagram, timeout: Duration) -> String {
    socket.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) => return String::from_utf8_lossy(&buf[..n]).into_owned(),
            // A signal (the daemon child exiting) interrupts the wait: again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("a notification: {e:?}"),
        }
    }
}

/// The next datagram on `socket`, or `None` once `child` has exited (it
/// could not start: e.g. its free port was taken meanwhile by another test).
fn next_while_running(
    socket: &UnixDatagram,
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<String> {
    let deadline = Instant::now() + timeout;
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 512];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("a notification: {e:?}"),
        }
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(Instant::now() < deadline, "no notification in {timeout:?}");
    }
}

#[test]
fn systemd_hears_ready_and_stopping() {
    let dir = std::env::temp_dir().join(format!("fulcrum-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket_path = dir.join("notify");
    let _ = std::fs::remove_file(&socket_path);
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let config = dir.join("fulcrum.toml");
    let bin = fulcrum_bin(); // may build it first
                             // A fresh port per attempt: a daemon that exits before READY lost its
                             // port to another test between free_port() and its bind.
    let mut attempt = 0;
    let (mut child, port, ready, started) = loop {
        attempt += 1;
        let port = free_port();
        // A backend nobody listens on: readiness is about Fulcrum's listeners.
        std::fs::write(
            &config,
            format!(
                "[[cluster]]\nname = \"main\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:{port}\"\n\
                 [[cluster.backend]]\naddress = \"127.0.0.1:{}\"\nrole = \"primary\"\n\
                 [[cluster.user]]\nname = \"app\"\npassword = \"secret\"\n",
                free_port()
            ),
        )
        .unwrap();
        let started = Instant::now();
        let mut child = Command::new(&bin)
            .arg("--config")
            .arg(&config)
            .env("NOTIFY_SOCKET", &socket_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("fulcrum");
        match next_while_running(&socket, &mut child, Duration::from_secs(20)) {
            Some(ready) => break (child, port, ready, started),
            None if attempt < 3 => continue,
            None => panic!(
                "fulcrum exited before READY three times: {:?}",
                child.try_wait()
            ),
        }
    };
    assert!(ready.starts_with("READY=1"), "{ready}");
    assert!(ready.contains("STATUS=serving 1 cluster(s)"), "{ready}");
    // The signal handlers are in place by READY: a SIGHUP at once reloads
    // (before, it could end the process when it came first).
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let reloading = next(&socket, Duration::from_secs(20));
    assert!(reloading.starts_with("RELOADING=1"), "{reloading}");
    let reloaded = next(&socket, Duration::from_secs(20));
    assert!(reloaded.contains("config reloaded"), "{reloaded}");
    // Ready means the listener accepts.
    assert!(wait_for_tcp(
        &format!("127.0.0.1:{port}"),
        Duration::from_millis(500)
    ));
    assert!(started.elapsed() < Duration::from_secs(20));
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let stopping = next(&socket, Duration::from_secs(20));
    assert!(stopping.starts_with("STOPPING=1"), "{stopping}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
