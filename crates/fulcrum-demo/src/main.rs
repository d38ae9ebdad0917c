//! `cargo run --release -p fulcrum-demo`: starts a throwaway PostgreSQL 15
//! primary with two streaming replicas (via fulcrum-testkit), showing
//! progress while it builds them, runs Fulcrum in front of them in this
//! process with its admin console, metrics and status page, prints how to
//! reach each once Fulcrum really listens, and tears everything down on
//! Ctrl-C.

#![forbid(unsafe_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::ExitCode;

use fulcrum_testkit::{free_port, PgCluster, APP_DB, APP_PASSWORD, APP_USER};
use tokio::sync::watch;

fn demo_port() -> u16 {
    // The conventional PgBouncer-style port when it is free, any free one otherwise.
    if TcpListener::bind(("127.0.0.1", 6432)).is_ok() {
        6432
    } else {
        free_port()
    }
}

/// A key for the demo's status page, from the clock and the process id
/// (a throwaway local demo: not a secret worth a crate).
fn rand_key() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_target(false)
        .init();
    println!(
        "[1/3] building a PostgreSQL 15 primary and 2 streaming replicas (initdb, base backups)..."
    );
    let started = std::time::Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let ticker = std::thread::spawn(move || {
        while done_rx
            .recv_timeout(std::time::Duration::from_secs(3))
            .is_err()
        {
            println!(
                "      ... still building ({} s)",
                started.elapsed().as_secs()
            );
        }
    });
    let built = PgCluster::builder().replicas(2).start();
    let _ = done_tx.send(());
    let _ = ticker.join();
    let cluster = match built {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fulcrum-demo: cannot start PostgreSQL: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "[2/3] cluster up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let port = demo_port();
    let (admin_port, metrics_port) = (free_port(), free_port());
    let status_key = format!("demo-{:016x}", rand_key());
    let mut toml = format!(
        "[fulcrum]\nlog = \"info\"\nadmin = \"127.0.0.1:{admin_port}\"\nmetrics = \"127.0.0.1:{metrics_port}\"\nstatus_key = \"{status_key}\"\n\n[[fulcrum.admin_user]]\nname = \"ops\"\npassword = \"ops-secret\"\n\n[[cluster]]\nname = \"demo\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:{port}\"\npool_mode = \"transaction\"\npool_size = 20\nclient_auth = \"scram-sha-256\"\n\n[[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\nweight = 1\n",
        cluster.primary().addr()
    );
    for r in cluster.replicas() {
        toml.push_str(&format!(
            "\n[[cluster.backend]]\naddress = \"{}\"\nrole = \"replica\"\nweight = 1\n",
            r.addr()
        ));
    }
    toml.push_str(&format!(
        "\n[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n"
    ));
    let config = match fulcrum_config::parse(&toml, Path::new("demo.toml")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fulcrum-demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("[3/3] starting Fulcrum...");
    let primary = cluster.primary().addr();
    let replicas: Vec<String> = cluster.replicas().iter().map(|r| r.addr()).collect();
    // Told once the listener answers, not before.
    let announce = move || {
        println!("\nFulcrum is listening on 127.0.0.1:{port} in front of:");
        println!("  primary  {primary}");
        for r in &replicas {
            println!("  replica  {r}");
        }
        println!("\nConnect with:\n  PGPASSWORD={APP_PASSWORD} psql -h 127.0.0.1 -p {port} -U {APP_USER} {APP_DB}");
        println!("Benchmark with:\n  PGPASSWORD={APP_PASSWORD} pgbench -i -h 127.0.0.1 -p {port} -U {APP_USER} {APP_DB}");
        println!("Admin console:\n  PGPASSWORD=ops-secret psql -h 127.0.0.1 -p {admin_port} -U ops fulcrum   (SHOW HELP;)");
        println!("Metrics:\n  http://127.0.0.1:{metrics_port}/metrics");
        println!("Status page:\n  http://127.0.0.1:{metrics_port}/?key={status_key}");
        println!("\nCtrl-C stops Fulcrum and removes the cluster.\n");
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = runtime.block_on(async move {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = tx.send(true);
        });
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            while tokio::time::Instant::now() < deadline {
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    announce();
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            eprintln!("fulcrum-demo: Fulcrum is not listening on 127.0.0.1:{port} after 30 s");
        });
        let set_log =
            std::sync::Arc::new(|_: &str| Err("the demo's log filter is fixed (info)".to_string()));
        match fulcrum::run(config, rx, set_log).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fulcrum-demo: {e}");
                ExitCode::FAILURE
            }
        }
    });
    drop(cluster);
    println!("stopped; the cluster is removed.");
    code
}
