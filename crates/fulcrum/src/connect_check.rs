//! `fulcrum check --connect`: logs in to every backend of every cluster
//! with each login the config holds (the health probe's, and each
//! `[[cluster.user]]`'s server login), and reports each backend's role or
//! why the login failed, as a DBA checks a new config before a restart.
//! The probes' own code does the logging in, so what works here works for
//! the health loop.

use std::time::Duration;

use fulcrum_cluster::ops::{OpsError, ServerOps};
use fulcrum_config::{Cluster, Config, Protocol};

/// One login's answer from one backend.
pub struct Line {
    pub cluster: String,
    pub backend: String,
    pub user: String,
    pub outcome: Result<&'static str, String>,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (
            Line {
                cluster,
                backend,
                user,
                ..
            },
            what,
        ) = (self, &self.outcome);
        match what {
            Ok(role) => write!(f, "{cluster}: {backend} as {user}: ok, {role}"),
            Err(why) => write!(f, "{cluster}: {backend} as {user}: FAILED: {why}"),
        }
    }
}

/// Every (cluster, backend, login) in the config, tried at once per cluster.
pub async fn check(config: &Config) -> Vec<Line> {
    let mut out = Vec::new();
    for cluster in &config.clusters {
        for (user, password) in logins(cluster) {
            let mut as_user = cluster.clone();
            as_user.health.user = user.clone();
            as_user.health.password = password;
            let outcomes = match cluster.protocol {
                Protocol::Postgres => {
                    probe_all(
                        &fulcrum_postgres::backend::health::PgServerOps::new(&as_user),
                        cluster,
                    )
                    .await
                }
                Protocol::Mysql => {
                    probe_all(
                        &fulcrum_mysql::backend::health::MariaServerOps::new(&as_user),
                        cluster,
                    )
                    .await
                }
            };
            for (b, outcome) in outcomes.into_iter().enumerate() {
                out.push(Line {
                    cluster: cluster.name.clone(),
                    backend: cluster.backends[b].address.clone(),
                    user: user.clone(),
                    outcome,
                });
            }
        }
    }
    out
}

/// The health probe's login, then each user's server login and each
/// login a `[[cluster.database]]` forces, once each; not the users whose
/// password is given as a hash (a SCRAM verifier logs in only with the
/// keys a client proves, so nothing can be tried here).
fn logins(cluster: &Cluster) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        vec![(cluster.health.user.clone(), cluster.health.password.clone())];
    let users = cluster
        .users
        .iter()
        .filter(|u| u.server_hash().is_none())
        .map(|u| (u.server_user().to_owned(), u.server_password().to_owned()));
    let forced = cluster
        .databases
        .iter()
        .filter_map(|d| d.server.as_ref())
        .map(|l| (l.user.clone(), l.password.clone()));
    for login in users.chain(forced) {
        if !out.iter().any(|(n, _)| *n == login.0) {
            out.push(login);
        }
    }
    out
}

async fn probe_all<S: ServerOps>(ops: &S, cluster: &Cluster) -> Vec<Result<&'static str, String>> {
    let limit = cluster.connect_timeout.max(Duration::from_secs(1)) + cluster.health.timeout;
    let mut out = Vec::new();
    for b in 0..cluster.backends.len() {
        out.push(match tokio::time::timeout(limit, ops.probe(b)).await {
            Ok(Ok(o)) if o.writable => Ok("primary (takes writes)"),
            Ok(Ok(o)) if o.detached => Ok("read-only, replicating from nobody"),
            Ok(Ok(_)) => Ok("replica (read-only)"),
            Ok(Err(OpsError::LoginRefused(why))) => Err(format!("login refused: {why}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {limit:?}")),
        });
    }
    out
}
