//! The status page on the metrics port, in a real browser: headless
//! Chromium (Debian's) loads `/?key=...` against a running cluster, and
//! the test reads the rendered DOM: each backend's role, a pool's client
//! counts; then again after a failover (the new primary, the failover, the
//! old primary down with its reason, a pool's counts). The JSON API refuses
//! a request without the key. The page, the API and `/metrics` carry
//! the security headers (a CSP admitting the page's inline script and style
//! by hash, no framing, no sniffing).

use std::process::Command;
use std::time::{Duration, Instant};

use fulcrum_suite::{http_get, http_get_head, pg_connect, with_metrics, PgProxyConfig};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, APP_DB, APP_USER};

const KEY: &str = "status-key-for-the-tests";

/// The page as Chromium renders it (its DOM after the scripts ran).
fn rendered(port: u16) -> String {
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
            "--dump-dom",
            &format!("http://127.0.0.1:{port}/?key={KEY}"),
        ])
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let toml = with_metrics(&cfg.to_toml(), metrics).replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nstatus_key = \"{KEY}\"\n"),
        1,
    );
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
    let toml = with_metrics(&cfg.to_toml(), metrics).replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nstatus_key = \"{KEY}\"\n"),
        1,
    );
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
