//! The status page on the metrics port, in a real browser: headless
//! Chromium (Debian's) loads `/?key=...` against a running cluster, and
//! the test reads the rendered DOM: each backend's role, a pool's client
//! counts; then again after a failover (the new primary, the failover, the
//! old primary down with its reason, a pool's counts). The JSON API refuses
//! a request without the key. The page, the API and `/metrics` carry
//! the security headers (a CSP admitting the page's inline script and style
//! by hash, no framing, no sniffing). After traffic (distinct statements, a
//! failing one) and two history samples, the page as an operator reads it:
//! a screenshot that is a real PNG with something drawn, and in the DOM the
//! TPS, error and pool-wait charts drawn from the history, the statements
//! by total time with their normalised text in ms, the primary's coloured
//! row, and the mirror and cache sections.

use std::process::Command;
use std::time::{Duration, Instant};

use fulcrum_suite::{http_get, http_get_head, pg_connect, with_metrics, PgProxyConfig};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, APP_DB, APP_USER};

const KEY: &str = "status-key-for-the-tests";

/// `cfg` with the metrics port on `metrics` and the status page on, under `KEY`.
fn with_status_page(cfg: &PgProxyConfig, metrics: u16) -> String {
    with_metrics(&cfg.to_toml(), metrics).replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nstatus_key = \"{KEY}\"\n"),
        1,
    )
}

/// Headless Chromium on the page, with `what` (`--dump-dom`,
/// `--screenshot=...`): its standard output.
fn chromium(port: u16, what: &[&str]) -> String {
    let chromium = fulcrum_testkit::tool("/usr/bin/chromium", "chromium");
    let profile = std::env::temp_dir().join(format!("fulcrum-chromium-{}", std::process::id()));
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=5000",
            &format!("--user-data-dir={}", profile.display()),
        ])
        .args(what)
        .arg(format!("http://127.0.0.1:{port}/?key={KEY}"))
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The page as Chromium renders it (its DOM after the scripts ran).
fn rendered(port: u16) -> String {
    chromium(port, &["--dump-dom"])
}

/// The rendered page once `ready` holds, or the last one seen.
async fn rendered_until(port: u16, timeout: Duration, ready: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let dom = tokio::task::block_in_place(|| rendered(port));
        if ready(&dom) || start.elapsed() > timeout {
            return dom;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_roles_and_pools_before_and_after_a_failover() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).unwrap();
    let (primary, replica) = (c.primary().addr(), c.replicas()[0].addr());
    let cfg = PgProxyConfig::new(&primary)
        .client_auth("md5")
        .replica(&replica)
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"")
        .extra("health_interval = \"500ms\"")
        .extra("failover = \"promote\"")
        .extra("failover_timeout = \"1s\"");
    let metrics = free_port();
    let toml = with_status_page(&cfg, metrics);
    let _p = FulcrumProcess::start(&toml).unwrap();

    // The API wants the key; the page is there with it.
    let (head, _) = http_get(metrics, "/api/v1/clusters");
    assert!(head.contains("401"), "{head}");
    let (head, body) = http_get(metrics, &format!("/api/v1/clusters?key={KEY}"));
    assert!(
        head.contains("200") && body.contains(&primary),
        "{head}\n{body}"
    );

    // A client in a transaction: one active client in the app pool.
    let client = pg_connect(&cfg).await;
    client.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let pool_row = format!("<td>main</td><td>{APP_DB}</td><td>{APP_USER}</td><td>1</td><td>0</td>");
    let dom = rendered_until(metrics, Duration::from_secs(30), |d| d.contains(&pool_row)).await;
    assert!(
        dom.contains(&format!(
            "<tr class=\"primary up\"><td>main</td><td>{primary}</td><td>primary</td>"
        )),
        "the primary's row:\n{dom}"
    );
    assert!(
        dom.contains(&format!(
            "<td>{replica}</td><td>replica</td><td>up</td><td></td>"
        )),
        "the replica's row, with no reason (in service):\n{dom}"
    );
    assert!(
        dom.contains(&pool_row),
        "the pool's counts (1 active, 0 waiting):\n{dom}"
    );
    client.batch_execute("COMMIT").await.ok();

    // After a failover the page shows the new primary, and the old one down.
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let promoted = format!("<td>{replica}</td><td>primary</td>");
    let dom = rendered_until(metrics, Duration::from_secs(30), |d| d.contains(&promoted)).await;
    assert!(
        dom.contains(&promoted),
        "the promoted replica is the primary:\n{dom}"
    );
    // The failover, with its time, in the page's failover table.
    let failover = format!("<td>{primary}</td><td>{replica}</td>");
    let dom = rendered_until(metrics, Duration::from_secs(10), |d| d.contains(&failover)).await;
    assert!(
        dom.contains(&failover) && dom.contains("Z</td>"),
        "the failover and its time:\n{dom}"
    );
    // The old primary is down, and its row says why (reason.rs's "down: ...",
    // SHOW BACKENDS' reason column).
    let down = |role: &str| format!("<td>{primary}</td><td>{role}</td><td>down</td><td>down: ");
    assert!(
        dom.contains(&down("replica")) || dom.contains(&down("writable (not the primary)")),
        "the old primary is down, with its reason:\n{dom}"
    );

    // A client in a transaction on the new primary: the pool's counts.
    let client = pg_connect(&cfg).await;
    client.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let pool_row =
        format!("<td>main</td><td>{APP_DB}</td><td>{APP_USER}</td><td>1</td><td>0</td><td>1</td>");
    let dom = rendered_until(metrics, Duration::from_secs(30), |d| d.contains(&pool_row)).await;
    assert!(
        dom.contains(&pool_row),
        "the pool's counts after the failover (1 active client, 0 waiting, 1 server connection in use):\n{dom}"
    );
    client.batch_execute("COMMIT").await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_the_api_carry_security_headers() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).unwrap();
    let cfg = PgProxyConfig::new(&c.primary().addr());
    let metrics = free_port();
    let toml = with_status_page(&cfg, metrics);
    let _p = FulcrumProcess::start(&toml).unwrap();
    for path in [
        format!("/?key={KEY}"),
        format!("/api/v1/clusters?key={KEY}"),
        "/api/v1/clusters".to_owned(),
        "/metrics".to_owned(),
    ] {
        let (head, _) = tokio::task::block_in_place(|| http_get_head(metrics, &path));
        let header = |name: &str| {
            head.lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                })
                .unwrap_or_else(|| panic!("{path}: no {name}:\n{head}"))
        };
        assert_eq!(header("X-Frame-Options"), "DENY", "{path}");
        assert_eq!(header("X-Content-Type-Options"), "nosniff", "{path}");
        let csp = header("Content-Security-Policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        if path.starts_with("/?") {
            assert!(
                csp.contains("default-src 'self'")
                    && csp.contains("script-src 'sha256-")
                    && csp.contains("style-src 'sha256-"),
                "the page's own script and style are admitted by hash: {csp}"
            );
        } else {
            assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        }
    }
}

/// The text of each cell of each row of the first table after `anchor`
/// in `dom` (tags stripped).
fn table_after(dom: &str, anchor: &str) -> Vec<Vec<String>> {
    let Some(start) = dom.find(anchor) else {
        return Vec::new();
    };
    let rest = &dom[start..];
    let end = rest.find("</table>").unwrap_or(rest.len());
    rest[..end]
        .split("<tr")
        .skip(1)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let inner = cell.split_once('>').map_or("", |(_, t)| t);
                    let inner = inner.split("</td>").next().unwrap_or("");
                    inner
                        .replace("&amp;", "&")
                        .replace("&lt;", "<")
                        .replace("&gt;", ">")
                })
                .collect()
        })
        .filter(|cells: &Vec<String>| !cells.is_empty())
        .collect()
}

/// The `<svg id="...">` element of `dom`, whole.
fn svg<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("<svg id=\"{id}\""))?;
    let len = dom[start..].find("</svg>")?;
    Some(&dom[start..start + len])
}

/// The value of attribute `name` in `element`.
fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let at = element.find(&format!(" {name}=\""))? + name.len() + 3;
    element[at..].split('"').next()
}

/// A time cell ("12.34 ms") in milliseconds.
fn millis(cell: &str) -> f64 {
    cell.strip_suffix(" ms")
        .unwrap_or_else(|| panic!("{cell:?} has no ms unit"))
        .parse()
        .unwrap_or_else(|e| panic!("{cell:?}: {e}"))
}

/// The sum of every `"field":N` in `json`, and how often it occurs.
fn sum_of(json: &str, field: &str) -> (u64, usize) {
    let needle = format!("\"{field}\":");
    json.match_indices(&needle)
        .fold((0, 0), |(sum, n), (at, _)| {
            let digits: String = json[at + needle.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            (sum + digits.parse::<u64>().unwrap_or(0), n + 1)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_charts_statements_by_time_and_colours_after_traffic() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).unwrap();
    let (primary, replica) = (c.primary().addr(), c.replicas()[0].addr());
    let cfg = PgProxyConfig::new(&primary)
        .client_auth("md5")
        .replica(&replica)
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"")
        .extra("health_interval = \"500ms\"");
    let metrics = free_port();
    let toml = with_status_page(&cfg, metrics);
    let _p = FulcrumProcess::start(&toml).unwrap();

    // Traffic across at least two samples (every 5 s): a slow statement,
    // a fast one run more often, and one that fails (42P01).
    const HEAVY: &str = "SELECT pg_sleep(0.03) AS heavy_statement";
    const LIGHT: &str = "SELECT 1 AS light_statement";
    const FAILING: &str = "SELECT * FROM no_such_table_for_the_page";
    let normal = |s: &str| fulcrum_sql::normalize(s, fulcrum_sql::Dialect::Postgres, 2048);
    let client = pg_connect(&cfg).await;
    let (mut heavy_calls, mut errors) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(11) {
        client.batch_execute(HEAVY).await.unwrap();
        heavy_calls += 1;
        for _ in 0..3 {
            client.batch_execute(LIGHT).await.unwrap();
        }
        let e = client.batch_execute(FAILING).await.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("42P01"), "{e}");
        errors += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(heavy_calls > 10 && errors > 10);

    // The history: two points or more, holding the traffic and its errors.
    let deadline = Instant::now() + Duration::from_secs(20);
    let history = loop {
        let (head, body) = http_get(metrics, &format!("/api/v1/history?key={KEY}"));
        assert!(head.contains("200"), "{head}\n{body}");
        let (_, points) = sum_of(&body, "at_unix_ms");
        if points >= 2 && sum_of(&body, "errors").0 >= errors {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no two samples with the traffic: {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        history.contains("\"interval_s\":5") && history.contains("\"window_s\":600"),
        "{history}"
    );
    assert!(
        sum_of(&history, "transactions").0 >= heavy_calls * 4,
        "{history}"
    );

    // A screenshot: a real PNG, with something drawn in it.
    let dir = std::env::temp_dir().join(format!("fulcrum-status-shot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("page.png");
    tokio::task::block_in_place(|| {
        chromium(
            metrics,
            &[
                &format!("--screenshot={}", png.display()),
                "--window-size=1280,2000",
                "--hide-scrollbars",
            ],
        )
    });
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    assert!(
        bytes.len() > 10_000,
        "not a blank page: {} bytes",
        bytes.len()
    );

    // The DOM once the charts are drawn, between two reads of the history.
    let points_now = || {
        sum_of(
            &http_get(metrics, &format!("/api/v1/history?key={KEY}")).1,
            "at_unix_ms",
        )
        .1
    };
    let before = points_now();
    let dom = rendered_until(metrics, Duration::from_secs(30), |d| {
        d.contains("id=\"chart-tps\"") && d.contains(&normal(HEAVY))
    })
    .await;
    let after = points_now();

    // A chart for each of TPS, errors and pool waits, a line through the
    // history's points; TPS and errors saw traffic.
    for id in ["chart-tps", "chart-errors", "chart-waits"] {
        let chart = svg(&dom, id).unwrap_or_else(|| panic!("no {id} chart:\n{dom}"));
        let points = attribute(chart, "points")
            .unwrap_or_else(|| panic!("{id}: no line: {chart}"))
            .split_whitespace()
            .count();
        let listed: usize = attribute(chart, "data-points").unwrap().parse().unwrap();
        assert!(
            points >= 2 && points == listed && (before..=after).contains(&listed),
            "{id}: one point per history point ({before} to {after}): {chart}"
        );
        if id != "chart-waits" {
            let max: f64 = attribute(chart, "data-max").unwrap().parse().unwrap();
            assert!(max > 0.0, "{id} drew the traffic: {chart}");
            let ys: Vec<&str> = attribute(chart, "points")
                .unwrap()
                .split_whitespace()
                .filter_map(|p| p.split(',').nth(1))
                .collect();
            assert!(ys.iter().any(|y| *y != ys[0]), "{id}: a flat line: {chart}");
        }
    }

    // The statements by total time, with their normalised text, calls and
    // times in ms: the slow one first, its mean at least its sleep.
    let rows = table_after(&dom, "id=\"queries\"");
    let totals: Vec<f64> = rows.iter().map(|r| millis(&r[3])).collect();
    assert!(
        totals.windows(2).all(|w| w[0] >= w[1]),
        "by total time: {totals:?}\n{dom}"
    );
    let at = |text: &str| rows.iter().position(|r| r[1] == normal(text));
    let (heavy, light, failing) = (at(HEAVY), at(LIGHT), at(FAILING));
    let heavy = heavy.unwrap_or_else(|| panic!("{:?} in {rows:?}", normal(HEAVY)));
    assert!(light.is_some_and(|l| l > heavy), "{rows:?}");
    assert!(failing.is_some(), "the failing statement: {rows:?}");
    let row = &rows[heavy];
    assert!(row[2].parse::<u64>().unwrap() >= heavy_calls, "{row:?}");
    assert!(
        millis(&row[4]) >= 25.0 && millis(&row[5]) >= 25.0,
        "{row:?}"
    );
    assert_eq!(row[6], "0", "{row:?}");
    assert!(
        rows[failing.unwrap()][6].parse::<u64>().unwrap() >= errors,
        "{rows:?}"
    );

    // The primary's row: marked and coloured up; the replica's up.
    assert!(
        dom.contains(&format!(
            "<tr class=\"primary up\"><td>main</td><td>{primary}</td><td>primary</td><td>up</td>"
        )),
        "the primary's row:\n{dom}"
    );
    assert!(
        dom.contains(&format!(
            "<tr class=\"up\"><td>main</td><td>{replica}</td><td>replica</td><td>up</td>"
        )),
        "the replica's row:\n{dom}"
    );
    // Mirror and cache: not configured, and said so.
    assert!(
        dom.contains("<h2>Mirror differences</h2>") && dom.contains("mirror: not configured"),
        "the mirror section:\n{dom}"
    );
    assert!(
        dom.contains("cache: not configured"),
        "the cache row:\n{dom}"
    );
}
