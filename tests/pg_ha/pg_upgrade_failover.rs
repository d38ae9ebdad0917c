//! A binary upgrade, then a failover: the client that stayed on the old
//! process (a TLS client, whose session cannot move) follows the primary
//! the new process promoted, because the old process's health loops keep
//! observing after the hand-over; and the old process never promotes
//! itself.

use std::time::{Duration, Instant};

use fulcrum_suite::{rustls_tokio_postgres, serial, try_pg_connect, upgraded_to, KillOnDrop};
use fulcrum_testkit::{FulcrumProcess, PgCluster, Signal, TestCerts};

use super::pg_failover::port_of;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_left_on_the_old_process_follows_the_new_processs_failover() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    let certs = TestCerts::new().expect("certificates");
    let tls = rustls_tokio_postgres::listener_tls(&certs);
    let cfg = super::pg_failover::config(
        &c,
        &[
            "health_interval = \"300ms\"",
            "failover = \"promote\"",
            "failover_timeout = \"1s\"",
            &tls[0],
            &tls[1],
            &tls[2],
        ],
    );
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let write = "CREATE TABLE IF NOT EXISTS uf_t (x int); \
                 INSERT INTO uf_t VALUES (1); SELECT inet_server_port()";
    let stays = rustls_tokio_postgres::connect(&cfg, &certs.ca)
        .await
        .expect("connect over TLS");
    let primary_port = c.primary().port();
    assert_eq!(port_of(&stays, write).await.unwrap(), primary_port);

    p.signal(Signal::Usr2).unwrap();
    p.wait_for_log("handed over to process", Duration::from_secs(60))
        .unwrap();
    let new_pid = upgraded_to(&p.log_contents(), 1).expect("handed over");
    let _kill = KillOnDrop(new_pid);
    // A client of the new process, and the old one's, both write to the primary.
    let fresh = try_pg_connect(&cfg)
        .await
        .expect("connect to the new process");
    assert_eq!(port_of(&fresh, write).await.unwrap(), primary_port);
    assert_eq!(port_of(&stays, write).await.unwrap(), primary_port);
    assert!(
        p.try_wait().is_none(),
        "the old process stays for its client"
    );

    // The primary dies; the new process promotes the replica.
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let replica = &c.replicas()[0];
    let killed = Instant::now();
    while !tokio::task::block_in_place(|| replica.is_in_recovery()).is_ok_and(|r| !r) {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "never promoted:\n{}",
            p.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The client left on the old process writes to the new primary.
    let following = Instant::now();
    loop {
        match port_of(&stays, write).await {
            Ok(port) if port == replica.port() => break,
            other => assert!(
                following.elapsed() < Duration::from_secs(15),
                "the old process's client never followed the promotion: {other:?}\n{}",
                p.log_contents()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "promoted {:?} after the kill; the old process's client followed {:?} later",
        following - killed,
        following.elapsed()
    );
    // One promotion, by the new process: the old one's loops only observe.
    let log = p.log_contents();
    let promotions = log.matches("promoting the most advanced replica").count();
    assert_eq!(promotions, 1, "one promotion, not two:\n{log}");
}
