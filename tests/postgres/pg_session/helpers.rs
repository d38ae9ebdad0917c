//! Helpers shared by the pg_session tests: timeouts and roles, the cluster
//! (with replicas or without), the daemon, and one-row queries.

use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::PgProxyConfig;
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_USER};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Longest any single client call may take before the test calls it a hang.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A role the app user may take at login (`options=-c role=...`).
pub(super) const STARTUP_ROLE: &str = "fulcrum_startup_role";

/// This module's own cluster, not shared: `terminate_running` ends any
/// backend on the primary running a given statement, another module's too.
pub(super) fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder()
            .replicas(2)
            .start()
            .expect("start PostgreSQL cluster");
        c.primary()
            .sql_script(
                APP_DB,
                &format!(
                    "CREATE ROLE {STARTUP_ROLE};
                     GRANT {STARTUP_ROLE} TO {APP_USER};
                     CREATE TABLE ses_rows (id int);
                     GRANT ALL ON ses_rows TO PUBLIC;
                     -- A COMMIT that takes long: a deferred trigger sleeps at commit.
                     CREATE TABLE slow_commit (id int);
                     GRANT ALL ON slow_commit TO PUBLIC;
                     CREATE FUNCTION slow_commit_fn() RETURNS trigger LANGUAGE plpgsql AS
                       $$ BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
                     CREATE CONSTRAINT TRIGGER slow_commit_trg AFTER INSERT ON slow_commit
                       DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_fn();"
                ),
            )
            .expect("set up");
        c.wait_replicas_caught_up(Duration::from_secs(30))
            .expect("replicas caught up");
        c
    })
}

pub(super) fn with_replicas(pool_size: u32) -> PgProxyConfig {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).pool_size(pool_size);
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg
}

pub(super) fn start(cfg: PgProxyConfig) -> (FulcrumProcess, PgProxyConfig) {
    (
        FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum"),
        cfg,
    )
}

/// The first column of the first row of `sql`, within `CALL_TIMEOUT`.
pub(super) async fn one(client: &Client, sql: &str) -> String {
    let msgs = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .expect("one row")
}

pub(super) async fn exec(client: &Client, sql: &str) -> Result<(), tokio_postgres::Error> {
    tokio::time::timeout(CALL_TIMEOUT, client.batch_execute(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
}
