//! Read-your-writes across several instances: the causal token is a
//! server position, so a write's token taken on one instance makes a read
//! on another wait for it; `consistency = "user"` remembers a user's last
//! write in its own process only, so it does not carry over (the read on
//! the other instance goes to a replica applying 1 s late and misses).

use std::time::Duration;

use fulcrum_suite::{first_value, serial, try_pg_connect};
use fulcrum_testkit::{PgCluster, APP_DB};

use crate::fleet::start_fleet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_causal_token_carries_across_instances_and_user_does_not() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE marks (i int PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let r = &c.replicas()[0];
    r.sql("ALTER SYSTEM SET recovery_min_apply_delay = '1s'")
        .unwrap();
    r.sql("SELECT pg_reload_conf()").unwrap();
    let fleet = start_fleet(&c, 2, &["consistency = \"user\"".into()]);
    let (a, b) = (&fleet[0], &fleet[1]);
    let writer = try_pg_connect(&a.cfg).await.unwrap();
    let mut missed_by_user = 0;
    for i in 0..6 {
        writer
            .simple_query(&format!("INSERT INTO marks VALUES ({i})"))
            .await
            .unwrap();
        let token = first_value(&writer, "SHOW fulcrum.position").await;
        // The same user on the other instance, no token: that instance
        // knows nothing of the write.
        let plain = try_pg_connect(&b.cfg).await.unwrap();
        let seen = first_value(&plain, &format!("SELECT count(*) FROM marks WHERE i = {i}")).await;
        if seen == "0" {
            missed_by_user += 1;
        }
        // With the token taken on the first instance: always seen.
        let carried = try_pg_connect(&b.cfg).await.unwrap();
        carried
            .simple_query(&format!("SET fulcrum.min_position = '{token}'"))
            .await
            .unwrap();
        let seen = first_value(
            &carried,
            &format!("SELECT count(*) FROM marks WHERE i = {i}"),
        )
        .await;
        assert_eq!(
            seen, "1",
            "round {i}: the token from the other instance holds"
        );
        // And on the writer's own instance, `user` holds without a token.
        let same = try_pg_connect(&a.cfg).await.unwrap();
        let seen = first_value(&same, &format!("SELECT count(*) FROM marks WHERE i = {i}")).await;
        assert_eq!(seen, "1", "round {i}: user holds within one instance");
    }
    eprintln!("consistency = user across instances: {missed_by_user} of 6 reads on the other instance missed the write; the token: 0 of 6");
    assert!(
        missed_by_user > 0,
        "user is per instance: a replica 1 s behind should have missed some"
    );
}
