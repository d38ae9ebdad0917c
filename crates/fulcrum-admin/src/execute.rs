//! Running one console command: the operator commands (PAUSE, RESUME,
//! KILL, RECONNECT, WAIT_CLOSE, RESET QUERIES, DISABLE, ENABLE, RELOAD,
//! SHUTDOWN, SWITCHOVER, SET log) and how a command names its cluster or backend;
//! `SHOW` tables are `show`'s.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_cluster::ClusterAdmin;
use fulcrum_postgres::codec::backend_msg;

use crate::command::Command;
use crate::Admin;

/// How long WAIT_CLOSE waits for connections in use to close.
const PAUSE_WAIT: Duration = Duration::from_secs(60);

pub(crate) type Failure = (&'static str, String);

/// Asks the daemon's `what` (reload, upgrade) task and waits for its
/// answer: the outer error when it cannot be asked, the inner one its own.
async fn ask(
    to: Option<&tokio::sync::mpsc::Sender<crate::ReloadRequest>>,
    what: &str,
) -> Result<Result<String, String>, Failure> {
    let tx = to.ok_or(("55000", format!("fulcrum admin: {what} is not available")))?;
    let (reply, rx) = tokio::sync::oneshot::channel();
    tx.send(reply).await.map_err(|_| {
        (
            "55000",
            "fulcrum admin: the daemon is shutting down".to_string(),
        )
    })?;
    rx.await
        .map_err(|_| ("55000", format!("fulcrum admin: the {what} did not answer")))
}

impl Admin {
    pub(crate) async fn execute(&self, cmd: Command, out: &mut BytesMut) -> Result<(), Failure> {
        enum Kind {
            Disable,
            Other,
        }
        let cmd_kind = if matches!(cmd, Command::DisableDatabase(_)) {
            Kind::Disable
        } else {
            Kind::Other
        };
        match cmd {
            Command::Show(what) => {
                self.show(what, out);
                Ok(())
            }
            Command::Pause(target) => {
                self.pause(target.as_deref()).await?;
                backend_msg::command_complete(out, "PAUSE");
                Ok(())
            }
            Command::ShowQueries(target) => self.show_queries(target.as_deref(), out),
            Command::Kill(database) => {
                let mut clients = 0;
                for e in fulcrum_cluster::clients::registry().snapshot() {
                    if *e.database == *database {
                        e.kill();
                        clients += 1;
                    }
                }
                let mut pools = 0;
                for c in self.clusters() {
                    pools += c.reconnect(Some(&database));
                }
                tracing::info!(%database, clients, pools, "admin KILL");
                backend_msg::command_complete(out, "KILL");
                Ok(())
            }
            Command::Reconnect(database) => {
                for c in self.clusters() {
                    c.reconnect(database.as_deref());
                }
                backend_msg::command_complete(out, "RECONNECT");
                Ok(())
            }
            Command::WaitClose(database) => {
                let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
                loop {
                    let left: usize = self
                        .clusters()
                        .iter()
                        .map(|c| c.retiring(database.as_deref()))
                        .sum();
                    if left == 0 {
                        break;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err((
                            "57014",
                            format!("fulcrum admin: {left} server connections still in use after 60s; they close when their transactions end"),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                backend_msg::command_complete(out, "WAIT_CLOSE");
                Ok(())
            }
            Command::FlushCache(table) => {
                let mut dropped = 0;
                for c in self.clusters() {
                    if let Some(cache) = c.cache() {
                        dropped += cache.flush(table.as_deref());
                    }
                }
                tracing::info!(table = ?table, dropped, "result cache flushed by an operator");
                backend_msg::command_complete(out, &format!("FLUSH {dropped}"));
                Ok(())
            }
            Command::ResetQueries(target) => {
                for c in self.targets(target.as_deref())? {
                    c.digests().reset();
                }
                backend_msg::command_complete(out, "RESET");
                Ok(())
            }
            Command::Resume(target) => {
                self.resume(target.as_deref())?;
                backend_msg::command_complete(out, "RESUME");
                Ok(())
            }
            Command::DisableDatabase(db) | Command::EnableDatabase(db) => {
                let disable = matches!(cmd_kind, Kind::Disable);
                fulcrum_cluster::clients::registry().set_database_disabled(&db, disable);
                tracing::warn!(database = %db, disable, "database {} by an operator: new logins {}", if disable { "disabled" } else { "enabled" }, if disable { "refused" } else { "accepted" });
                backend_msg::command_complete(out, if disable { "DISABLE" } else { "ENABLE" });
                Ok(())
            }
            Command::Disable(target) => self.set_disabled(&target, true, out),
            Command::Enable(target) => self.set_disabled(&target, false, out),
            Command::Shutdown => {
                let tx = self.shutdown.as_ref().ok_or((
                    "55000",
                    "fulcrum admin: SHUTDOWN is not available here".to_string(),
                ))?;
                tracing::warn!("SHUTDOWN from the admin console: draining, then stopping");
                let _ = tx.send(true);
                backend_msg::command_complete(out, "SHUTDOWN");
                Ok(())
            }
            Command::Reload => {
                let summary = ask(self.reload.as_ref(), "reload").await?.map_err(|e| {
                    (
                        "F0000",
                        format!(
                            "fulcrum admin: config not reloaded, the running config stays: {e}"
                        ),
                    )
                })?;
                crate::rows::result(out, &["reload"], &[vec![summary]]);
                Ok(())
            }
            Command::Upgrade => {
                let summary = ask(self.upgrade.as_ref(), "upgrade").await?.map_err(|e| {
                    (
                        "F0000",
                        format!("fulcrum admin: upgrade failed, this process keeps serving: {e}"),
                    )
                })?;
                crate::rows::result(out, &["upgrade"], &[vec![summary]]);
                Ok(())
            }
            Command::Switchover { cluster, backend } => {
                let c = self.cluster(&cluster).ok_or_else(|| {
                    (
                        "42704",
                        format!("fulcrum admin: no cluster named {cluster:?}"),
                    )
                })?;
                let target = c
                    .config()
                    .backends
                    .iter()
                    .position(|b| b.address == backend)
                    .ok_or_else(|| {
                        (
                            "42704",
                            format!(
                                "fulcrum admin: cluster {cluster:?} has no backend {backend:?}"
                            ),
                        )
                    })?;
                let handle = c.monitor().ok_or((
                    "55000",
                    "fulcrum admin: the health loop is not running".to_string(),
                ))?;
                let held = handle
                    .switchover(target)
                    .await
                    .map_err(|e| ("55000", format!("fulcrum admin: switchover not done: {e}")))?;
                crate::rows::result(
                    out,
                    &["cluster", "new_primary", "held_ms"],
                    &[vec![cluster, backend, held.as_millis().to_string()]],
                );
                Ok(())
            }
            Command::SetLog(filter) => {
                (self.set_log)(&filter).map_err(|e| ("22023", format!("fulcrum admin: {e}")))?;
                tracing::info!(filter = %filter, "log filter changed");
                backend_msg::command_complete(out, "SET");
                Ok(())
            }
        }
    }

    pub(crate) fn targets(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<Arc<dyn ClusterAdmin>>, Failure> {
        match name {
            None => Ok(self.clusters()),
            Some(n) => match self.cluster(n) {
                Some(c) => Ok(vec![c]),
                // PgBouncer's meaning: a database; the clusters that serve
                // it: those listing it in [[cluster.database]], else those
                // listing none (any name) that have its clients or pools now.
                None => {
                    let clusters = self.clusters();
                    let mut serving: Vec<_> = clusters
                        .iter()
                        .filter(|c| c.config().databases.iter().any(|d| d.name == n))
                        .cloned()
                        .collect();
                    if serving.is_empty() {
                        let clients = fulcrum_cluster::clients::registry().snapshot();
                        serving = clusters
                            .into_iter()
                            .filter(|c| {
                                let cfg = c.config();
                                cfg.databases.is_empty()
                                    && (c.pools().iter().any(|p| p.database == n)
                                        || clients
                                            .iter()
                                            .any(|e| *e.cluster == *cfg.name && *e.database == *n))
                            })
                            .collect();
                    }
                    if serving.is_empty() {
                        Err((
                            "42704",
                            format!("fulcrum admin: no cluster named {n:?}, and no cluster serves a database {n:?}"),
                        ))
                    } else {
                        Ok(serving)
                    }
                }
            },
        }
    }

    /// A backend named by address, or `cluster/address` when two clusters share it.
    fn backend(&self, target: &str) -> Result<(Arc<dyn ClusterAdmin>, usize), Failure> {
        let (cluster, address) = match target.split_once('/') {
            Some((c, a))
                if !c.starts_with('[')
                    && !c.is_empty()
                    && !a.is_empty()
                    && !target.starts_with('/') =>
            {
                (Some(c), a)
            }
            _ => (None, target),
        };
        let found: Vec<(Arc<dyn ClusterAdmin>, usize)> = self
            .clusters()
            .iter()
            .filter(|c| cluster.is_none_or(|n| c.config().name == n))
            .flat_map(|c| {
                c.config()
                    .backends
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.address == address)
                    .map(|(i, _)| (c.clone(), i))
                    .collect::<Vec<_>>()
            })
            .collect();
        match found.len() {
            1 => Ok(found.into_iter().next().expect("one")),
            0 => Err((
                "42704",
                format!("fulcrum admin: no backend {target:?}; SHOW CLUSTERS lists them"),
            )),
            _ => Err((
                "42725",
                format!("fulcrum admin: {address:?} is in several clusters; say cluster/address"),
            )),
        }
    }

    pub(crate) fn set_disabled(
        &self,
        target: &str,
        disabled: bool,
        out: &mut BytesMut,
    ) -> Result<(), Failure> {
        let (c, b) = self.backend(target)?;
        if disabled && c.router().is_primary(b) {
            return Err((
                "55000",
                format!("fulcrum admin: {target} is the primary of cluster {:?}; it cannot be drained (a planned SWITCHOVER would move it)", c.config().name),
            ));
        }
        c.router().set_disabled(b, disabled);
        tracing::warn!(cluster = %c.config().name, backend = %target, disabled, "backend {} by an operator", if disabled { "disabled" } else { "enabled" });
        backend_msg::command_complete(out, if disabled { "DISABLE" } else { "ENABLE" });
        Ok(())
    }
}
