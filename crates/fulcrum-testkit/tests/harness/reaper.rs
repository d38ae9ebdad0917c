//! The servers of a cluster that is never dropped (a `static`, or a process
//! that aborts) must still die with the test process. Each test re-runs this
//! binary as a child that starts a static cluster (PostgreSQL or MariaDB) and
//! aborts; the parent then watches the cluster's ports and directory disappear.

use std::path::PathBuf;
use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use fulcrum_testkit::{MariaCluster, PgCluster};

const CHILD_ENV: &str = "FULCRUM_TESTKIT_REAPER_CHILD";

static CLUSTER: LazyLock<PgCluster> = LazyLock::new(|| {
    PgCluster::builder()
        .replicas(1)
        .start()
        .expect("static test cluster")
});

static MARIA_CLUSTER: LazyLock<MariaCluster> = LazyLock::new(|| {
    MariaCluster::builder()
        .replicas(1)
        .start()
        .expect("static MariaDB test cluster")
});

/// Runs only inside the child process.
#[test]
fn child_starts_a_static_cluster_and_aborts() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let cluster = &*CLUSTER;
    cluster.primary().sql("CREATE TABLE t (x int)").unwrap();
    let ports: Vec<String> = cluster.nodes().map(|n| n.port().to_string()).collect();
    announce_and_abort(cluster.dir(), &ports);
}

/// Runs only inside the child process.
#[test]
fn child_starts_a_static_maria_cluster_and_aborts() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let cluster = &*MARIA_CLUSTER;
    cluster.primary().sql("CREATE TABLE t (x int)").unwrap();
    let ports: Vec<String> = cluster.nodes().map(|n| n.port().to_string()).collect();
    announce_and_abort(cluster.dir(), &ports);
}

fn announce_and_abort(dir: &std::path::Path, ports: &[String]) -> ! {
    println!("CLUSTER dir={} ports={}", dir.display(), ports.join(","));
    // No unwinding, no destructors, no atexit: like a crash.
    std::process::abort();
}

#[test]
fn servers_of_an_aborted_test_process_are_stopped_and_their_dir_removed() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    check_child_cleaned_up("reaper::child_starts_a_static_cluster_and_aborts");
}

#[test]
fn mariadb_servers_of_an_aborted_test_process_are_stopped_and_their_dir_removed() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    check_child_cleaned_up("reaper::child_starts_a_static_maria_cluster_and_aborts");
}

/// Runs the child test `child` (its path in this binary), which prints its cluster and aborts; then
/// waits until the cluster's ports are closed and its directory is gone.
fn check_child_cleaned_up(child: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([child, "--exact", "--nocapture"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child should have aborted");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CLUSTER "))
        .unwrap_or_else(|| {
            panic!(
                "child printed no cluster: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let (dir, ports) = line.split_once(" ports=").unwrap();
    let dir = PathBuf::from(dir.strip_prefix("dir=").unwrap());
    let ports: Vec<u16> = ports.split(',').map(|p| p.parse().unwrap()).collect();
    assert_eq!(ports.len(), 2);

    let started = Instant::now();
    let deadline = started + Duration::from_secs(15);
    loop {
        let open: Vec<u16> = ports
            .iter()
            .copied()
            .filter(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok())
            .collect();
        if open.is_empty() && !dir.exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 15 s: ports still open {open:?}, {} exists: {}",
            dir.display(),
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "reaper cleaned up {} in {:?}",
        dir.display(),
        started.elapsed()
    );
}
