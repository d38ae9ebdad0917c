//! Fulcrum's HTTP listener as the tests read it: one GET ([`http_get`], [`http_get_head`] with its headers), a
//! scrape of `/metrics` ([`scrape`], [`try_scrape`]), sums of samples from
//! a scrape ([`family_sum`], [`metric_sum`], [`replays`]), and a daemon
//! started with a metrics listener on a free port ([`start_with_metrics`]).

use std::io::{Read, Write};
use std::time::Duration;

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::config::with_metrics;

/// How long one request to the metrics listener may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// One `GET path` on `127.0.0.1:port`: the raw response, or the first I/O
/// error.
fn get_raw(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `GET path` on the metrics listener at `port`: (status line, body).
pub fn http_get(port: u16, path: &str) -> (String, String) {
    let out = get_raw(port, path).unwrap_or_else(|e| panic!("GET {path} on :{port}: {e}"));
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// `GET path` on the metrics listener at `port`: (whole head, body), for
/// tests that read the answer's headers.
pub fn http_get_head(port: u16, path: &str) -> (String, String) {
    let out = get_raw(port, path).unwrap_or_else(|e| panic!("GET {path} on :{port}: {e}"));
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_owned(), body.to_owned())
}

/// One scrape of `/metrics` on `port`: the body of a `200` answer (anything
/// else fails the test).
pub fn scrape(port: u16) -> String {
    let (status, body) = http_get(port, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{body}");
    body
}

/// [`scrape`] for callers that poll while the daemon may be going away: the
/// body of a `200` answer, `None` on any error.
pub fn try_scrape(port: u16) -> Option<String> {
    let out = get_raw(port, "/metrics").ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The sum of the samples of `family` in a scrape `text` whose labels
/// include every `(name, value)` of `filters` (all of them with none).
pub fn family_sum(text: &str, family: &str, filters: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} ")))
        .filter(|l| {
            filters
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum of the samples of counter `name` whose labels include `label`
/// (e.g. `outcome="replayed"`), from a scrape of `/metrics` on `port`.
pub fn metric_sum(port: u16, name: &str, label: &str) -> u64 {
    scrape(port)
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `fulcrum_transaction_replays_total{outcome="OUTCOME"}` summed over
/// clusters, from the metrics listener on `port`.
pub fn replays(port: u16, outcome: &str) -> u64 {
    metric_sum(
        port,
        "fulcrum_transaction_replays_total",
        &format!("outcome=\"{outcome}\""),
    )
}

/// Starts Fulcrum on `toml` with a metrics listener on a free port (see
/// [`with_metrics`]); returns the daemon and that port.
pub fn start_with_metrics(toml: &str) -> (FulcrumProcess, u16) {
    let metrics_port = free_port();
    let p = FulcrumProcess::start(&with_metrics(toml, metrics_port)).expect("start fulcrum");
    (p, metrics_port)
}
