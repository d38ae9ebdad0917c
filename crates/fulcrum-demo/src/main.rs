//! `cargo run --release -p fulcrum-demo`: starts a throwaway PostgreSQL 15
//! primary with two streaming replicas (via fulcrum-testkit), runs Fulcrum in
//! front of them in this process, prints how to connect, and tears everything
//! down on Ctrl-C.

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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_target(false)
        .init();
    println!("starting a PostgreSQL primary and 2 streaming replicas...");
    let cluster = match PgCluster::builder().replicas(2).start() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fulcrum-demo: cannot start PostgreSQL: {e}");
            return ExitCode::FAILURE;
        }
    };
    let port = demo_port();
    let mut toml = format!(
        "[fulcrum]\nlog = \"info\"\n\n[[cluster]]\nname = \"demo\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:{port}\"\npool_mode = \"transaction\"\npool_size = 20\nclient_auth = \"scram-sha-256\"\n\n[[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\nweight = 1\n",
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
    println!("\nFulcrum is listening on 127.0.0.1:{port} in front of:");
    println!("  primary  {}", cluster.primary().addr());
    for r in cluster.replicas() {
        println!("  replica  {}", r.addr());
    }
    println!("\nConnect with:\n  PGPASSWORD={APP_PASSWORD} psql -h 127.0.0.1 -p {port} -U {APP_USER} {APP_DB}");
    println!("Benchmark with:\n  PGPASSWORD={APP_PASSWORD} pgbench -i -h 127.0.0.1 -p {port} -U {APP_USER} {APP_DB}");
    println!("\nCtrl-C stops Fulcrum and removes the cluster.\n");
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
        let set_log =
            std::sync::Arc::new(|_: &str| Err("the demo has no admin console".to_string()));
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
