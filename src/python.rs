//! Python driver scripts (psycopg, asyncpg, PyMySQL) as the tests run them:
//! the test kit's Python environment (`fulcrum_testkit::python`), a time
//! limit that turns a hang into a failure, and the output checked.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `script` with `env` for at most `limit`; returns its standard
/// output. Panics, naming `what`, if it fails, runs past `limit` (a hang),
/// or a driver is missing from the environment.
pub fn run_python(what: &str, script: &str, env: &[(&str, &str)], limit: Duration) -> String {
    let mut child = Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .arg(fulcrum_testkit::python())
        .arg("-")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write script");
    let out = child.wait_with_output().expect("wait for python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(124) {
        panic!("{what} waited more than {limit:?}: a hang\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    if stderr.contains("No module named") || stderr.contains("couldn't import psycopg") {
        panic!("{what}: a driver is missing from the test kit's Python environment (target/fulcrum-python): remove that directory to make it again\n{stderr}");
    }
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}
