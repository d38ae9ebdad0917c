//! The relation catalog on a real primary (issue 46): PostgreSQL's
//! `read_relations` reads a database's relations, and the catalog's
//! answers for the result cache are checked for each kind of relation
//! (a table, a view, a sequence, a table with a trigger, a parent with an
//! ON DELETE CASCADE child, a partitioned table and its partition, a
//! materialized view, a table with a rule, a name in two schemas).

use std::sync::{Arc, OnceLock};

use fulcrum_cluster::function_catalog::Wanted;
use fulcrum_cluster::ProtocolContext;
use fulcrum_suite::PgProxyConfig;
use fulcrum_testkit::{PgCluster, APP_DB, APP_USER};

/// This module's primary (no replicas; its objects are its cases).
fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder()
            .replicas(0)
            .start()
            .expect("start PostgreSQL");
        c.primary()
            .sql_script(
                APP_DB,
                "CREATE TABLE rel_plain (id int PRIMARY KEY, v text);
                 CREATE VIEW rel_view AS SELECT * FROM rel_plain;
                 CREATE MATERIALIZED VIEW rel_matview AS SELECT * FROM rel_plain;
                 CREATE SEQUENCE rel_seq;
                 CREATE TABLE rel_audit (at timestamptz);
                 CREATE TABLE rel_triggered (id int);
                 CREATE FUNCTION rel_log() RETURNS trigger LANGUAGE plpgsql
                   AS $$ BEGIN INSERT INTO rel_audit VALUES (now()); RETURN NEW; END $$;
                 CREATE TRIGGER rel_log AFTER INSERT ON rel_triggered
                   FOR EACH ROW EXECUTE FUNCTION rel_log();
                 CREATE TABLE rel_parent (id int PRIMARY KEY);
                 CREATE TABLE rel_child (id int, parent int REFERENCES rel_parent ON DELETE CASCADE);
                 CREATE TABLE rel_strict_parent (id int PRIMARY KEY);
                 CREATE TABLE rel_strict_child (parent int REFERENCES rel_strict_parent);
                 CREATE TABLE rel_parted (k int) PARTITION BY RANGE (k);
                 CREATE TABLE rel_part1 PARTITION OF rel_parted FOR VALUES FROM (0) TO (10);
                 CREATE TABLE rel_base (id int);
                 CREATE TABLE rel_inheritor () INHERITS (rel_base);
                 CREATE TABLE rel_ruled (id int);
                 CREATE RULE rel_ruled_copy AS ON INSERT TO rel_ruled DO ALSO INSERT INTO rel_audit VALUES (now());
                 CREATE UNLOGGED TABLE rel_unlogged (id int);
                 CREATE SCHEMA rel_other;
                 CREATE TABLE rel_twice (id int);
                 CREATE VIEW rel_other.rel_twice AS SELECT 1 AS id;",
            )
            .expect("set up");
        c
    })
}

fn n(s: &str) -> Arc<str> {
    s.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_says_which_relations_may_be_kept_and_which_writes_are_wide() {
    let toml = PgProxyConfig::new(&cluster().primary().addr()).to_toml();
    let config =
        fulcrum_config::parse(&toml, std::path::Path::new("relations.toml")).expect("config");
    let cluster_config = config.clusters.into_iter().next().expect("a cluster");
    let ctx = fulcrum_postgres::frontend::ClusterContext::with_metrics(
        cluster_config,
        Arc::new(fulcrum_metrics::Metrics::new()),
        None,
    );
    let w = Wanted {
        user: n(APP_USER),
        options: (0, 0),
        database: n(APP_DB),
    };
    let relations = ctx.read_relations(&w).await.expect("relations read");
    let keepable =
        |names: &[&str]| relations.keepable(&names.iter().map(|s| n(s)).collect::<Vec<_>>());
    let wide =
        |names: &[&str]| relations.wide_writes(&names.iter().map(|s| n(s)).collect::<Vec<_>>());

    for table in [
        "rel_plain",
        "public.rel_plain",
        "rel_audit",
        "rel_unlogged",
        "rel_strict_parent",
        "rel_strict_child",
        "rel_child",
    ] {
        assert!(keepable(&[table]), "{table}: an ordinary table, kept");
        assert!(!wide(&[table]), "{table}: its writes change only itself");
    }
    for other in [
        "rel_view",
        "rel_matview",
        "rel_seq",
        "rel_parted",
        "rel_part1",
        "rel_base",
        "rel_inheritor",
        "rel_twice",
        "rel_missing",
        "pg_class",
    ] {
        assert!(!keepable(&[other]), "{other}: not kept");
        assert!(wide(&[other]), "{other}: a write to it reaches further");
    }
    for (table, why) in [
        ("rel_triggered", "a trigger"),
        ("rel_parent", "ON DELETE CASCADE"),
        ("rel_ruled", "a rule"),
    ] {
        assert!(keepable(&[table]), "{table}: still a table, kept");
        assert!(wide(&[table]), "{table}: {why}");
    }
    assert!(
        !keepable(&["rel_plain", "rel_view"]),
        "one view among tables"
    );
    assert!(wide(&["rel_plain", "rel_triggered"]));

    // Through the cluster's catalog, as the session asks it.
    let catalog = &ctx.relations;
    let user = n(APP_USER);
    assert!(
        !catalog.keepable(&user, (0, 0), APP_DB, &[n("rel_plain")]),
        "not known yet"
    );
    assert!(catalog.wide_writes(&user, (0, 0), APP_DB, &[n("rel_plain")]));
    let asked = catalog.wanted();
    assert_eq!(asked.len(), 1, "the database is asked for: {asked:?}");
    let found = ctx.read_relations(&asked[0]).await;
    let generation = catalog.generation();
    catalog.settle("main", asked[0].clone(), found, generation);
    assert!(catalog.keepable(&user, (0, 0), APP_DB, &[n("rel_plain")]));
    assert!(!catalog.wide_writes(&user, (0, 0), APP_DB, &[n("rel_plain")]));
    assert!(catalog.wide_writes(&user, (0, 0), APP_DB, &[n("rel_triggered")]));
    assert!(!catalog.keepable(&user, (0, 0), APP_DB, &[n("rel_view")]));
    assert!(
        catalog.read_committed(&user, (0, 0), APP_DB),
        "the server's default: READ COMMITTED"
    );
    catalog.forget();
    assert!(
        !catalog.keepable(&user, (0, 0), APP_DB, &[n("rel_plain")]),
        "forgotten on DDL"
    );
    assert!(!catalog.read_committed(&user, (0, 0), APP_DB), "not known");

    // Any role's REPEATABLE READ default on this database (whoever the
    // lookup logs in as) means a plain BEGIN is not proven READ COMMITTED.
    let primary = cluster().primary();
    let set = format!(
        "CREATE ROLE rel_rr; ALTER ROLE rel_rr IN DATABASE {APP_DB} \
         SET default_transaction_isolation = 'repeatable read'"
    );
    primary.sql_script(APP_DB, &set).expect("role setting");
    let with_role = ctx.read_relations(&w).await.expect("relations read");
    assert!(
        !with_role.read_committed,
        "a role's REPEATABLE READ default"
    );
    primary
        .sql_script(APP_DB, "DROP ROLE rel_rr")
        .expect("drop role");
    let without = ctx.read_relations(&w).await.expect("relations read");
    assert!(without.read_committed, "none left");
}

/// The first column of the first row `sql` returns through `client`.
async fn one(client: &tokio_postgres::Client, sql: &str) -> String {
    let msgs = client.simple_query(sql).await.expect(sql);
    msgs.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a row")
}

/// Through a real Fulcrum with `[cluster.cache] mode = "auto"` (writes
/// through Fulcrum invalidate: `invalidation = "proxy"`): a plain
/// table's reads are kept (a change behind Fulcrum's back is not seen
/// within the TTL), a view's are not, and a write firing a trigger that
/// writes another table invalidates that table's entries too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_keeps_tables_not_views_and_triggers_invalidate_the_database() {
    let primary = cluster().primary();
    primary
        .sql_script(
            APP_DB,
            "CREATE TABLE e2e_plain (v int); INSERT INTO e2e_plain VALUES (1);
             CREATE VIEW e2e_view AS SELECT v FROM e2e_plain;
             CREATE TABLE e2e_audit (v int);
             CREATE TABLE e2e_triggered (v int);
             CREATE FUNCTION e2e_log() RETURNS trigger LANGUAGE plpgsql
               AS $$ BEGIN INSERT INTO e2e_audit VALUES (NEW.v); RETURN NEW; END $$;
             CREATE TRIGGER e2e_log AFTER INSERT ON e2e_triggered
               FOR EACH ROW EXECUTE FUNCTION e2e_log();",
        )
        .expect("set up");
    let cfg = PgProxyConfig::new(&primary.addr())
        // The login waits for the catalog: the first reads may be kept.
        .extra("function_catalog_wait = \"10s\"")
        .extra("[cluster.cache]\nmode = \"auto\"\nttl = \"60s\"\ninvalidation = \"proxy\"");
    let _fulcrum = fulcrum_testkit::FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    let client = fulcrum_suite::pg_connect(&cfg).await;

    let plain = "SELECT count(*) FROM e2e_plain";
    let view = "SELECT count(*) FROM e2e_view";
    // `auto` keeps a key from its second miss on.
    for _ in 0..2 {
        assert_eq!(one(&client, plain).await, "1");
        assert_eq!(one(&client, view).await, "1");
    }
    primary
        .sql_script(APP_DB, "INSERT INTO e2e_plain VALUES (2)")
        .expect("a change behind Fulcrum's back");
    assert_eq!(one(&client, plain).await, "1", "the table's read was kept");
    assert_eq!(one(&client, view).await, "2", "the view's read was not");

    let audit = "SELECT count(*) FROM e2e_audit";
    assert_eq!(one(&client, audit).await, "0");
    assert_eq!(one(&client, audit).await, "0");
    client
        .simple_query("INSERT INTO e2e_triggered VALUES (7)")
        .await
        .expect("insert");
    assert_eq!(
        one(&client, audit).await,
        "1",
        "the trigger's write is seen"
    );
}
