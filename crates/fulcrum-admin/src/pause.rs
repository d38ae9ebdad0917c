//! PAUSE and RESUME: what a target names (every cluster, one cluster, or
//! PgBouncer's meaning, one database), setting the gate at the right
//! scope, and waiting until the paused units in progress are done.
//!
//! A database of a PostgreSQL cluster is paused alone (its pools; the
//! cluster's other databases go on). A MySQL cluster's server connections
//! serve every schema, so `PAUSE db` pauses the MySQL clusters serving it
//! whole, as before.

use std::sync::Arc;
use std::time::Duration;

use fulcrum_cluster::clients::ClientState;
use fulcrum_cluster::ClusterAdmin;

use crate::execute::Failure;
use crate::Admin;

/// How long PAUSE waits for transactions in progress to finish.
const PAUSE_WAIT: Duration = Duration::from_secs(60);

/// What one PAUSE or RESUME holds or releases in one cluster.
enum Scope {
    /// The whole cluster.
    Cluster(Arc<dyn ClusterAdmin>),
    /// One database of a PostgreSQL cluster.
    Database(Arc<dyn ClusterAdmin>, String),
}

impl Admin {
    fn scopes(&self, target: Option<&str>) -> Result<Vec<Scope>, Failure> {
        let Some(name) = target.filter(|n| self.cluster(n).is_none()) else {
            return Ok(self
                .targets(target)?
                .into_iter()
                .map(Scope::Cluster)
                .collect());
        };
        Ok(self
            .targets(Some(name))?
            .into_iter()
            .map(|c| match c.config().protocol {
                fulcrum_config::Protocol::Postgres => Scope::Database(c, name.to_owned()),
                fulcrum_config::Protocol::Mysql => Scope::Cluster(c),
            })
            .collect())
    }

    /// Admin PAUSE: holds new units of work of `target`, then waits until
    /// none of its units holds or waits for a server connection.
    pub(crate) async fn pause(&self, target: Option<&str>) -> Result<(), Failure> {
        let scopes = self.scopes(target)?;
        for s in &scopes {
            match s {
                Scope::Cluster(c) => c.router().set_paused(true),
                Scope::Database(c, d) => c.router().set_database_paused(d, true),
            }
        }
        let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
        // Twice quiet in a row: a database's units are counted by their
        // clients and pools, not at the gate, so a unit that had just
        // passed it is seen on the second look.
        let mut quiet = 0;
        while quiet < 2 {
            quiet = if scopes.iter().all(in_progress_done) {
                quiet + 1
            } else {
                0
            };
            if quiet == 2 {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err((
                    "57014",
                    "fulcrum admin: paused, but transactions still hold server connections after 60s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Admin RESUME: releases `target`; with no target, every cluster and
    /// every paused database.
    pub(crate) fn resume(&self, target: Option<&str>) -> Result<(), Failure> {
        if target.is_none() {
            for c in self.clusters() {
                for d in c.router().paused_databases() {
                    c.router().set_database_paused(&d, false);
                }
            }
        }
        for s in self.scopes(target)? {
            match s {
                Scope::Cluster(c) => c.router().set_paused(false),
                Scope::Database(c, d) => c.router().set_database_paused(&d, false),
            }
        }
        Ok(())
    }
}

/// No unit of the scope is between the gate and its server or on one.
fn in_progress_done(s: &Scope) -> bool {
    match s {
        Scope::Cluster(c) => c.router().total_load() + c.router().admitting() == 0,
        Scope::Database(c, d) => {
            let cluster = c.config().name.as_str();
            let pools_quiet = c.pools().iter().all(|p| p.database != *d || p.active == 0);
            pools_quiet
                && fulcrum_cluster::clients::registry()
                    .snapshot()
                    .iter()
                    .filter(|e| *e.cluster == *cluster && *e.database == **d)
                    .all(|e| e.state() == ClientState::Idle)
        }
    }
}
