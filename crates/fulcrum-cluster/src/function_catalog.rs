//! `function_catalog`: what the server says of the functions a read calls
//! that no list decides. Per database (schema on MySQL), the user-defined
//! functions and whether each may write (PostgreSQL `pg_proc.provolatile`,
//! MariaDB `information_schema.ROUTINES`), read in one query, cached per
//! cluster for `function_catalog_ttl` and forgotten on DDL seen through
//! Fulcrum. A read calling one that writes goes to the primary, and so does
//! every such read of a database not read yet; a name that is not a user
//! function is a built-in (a read), so built-ins cost no lookup. The
//! lookups run in the background (the protocol context drains
//! [`FunctionCatalog::wanted`] with its own query). Every configured
//! database is asked for at start and when the primary changes, and a
//! login to a database not read yet waits for its lookup up to
//! `function_catalog_wait` ([`FunctionCatalog::wait_known`]), so even the
//! first read after a start is routed by the catalog; a read itself never
//! waits. Pgpool-II 4 reads `provolatile` likewise when no list is set.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// What the server says a function does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    /// Safe on a replica (PostgreSQL: stable or immutable; MariaDB: NO SQL,
    /// READS SQL DATA, deterministic).
    Read,
    /// May write (PostgreSQL: volatile; MariaDB: MODIFIES SQL DATA, or
    /// CONTAINS SQL and not deterministic, the default).
    Write,
    /// A read whose result depends on its arguments alone (PostgreSQL:
    /// immutable in every overload): the result cache may keep reads
    /// calling it.
    Immutable,
}

/// The user-defined functions of one database (or schema), by name.
pub type Functions = HashMap<Arc<str>, FunctionKind>;

/// A lookup to run: the database's functions, and the login that reads
/// them (the user of the read that asked, with its protocol options:
/// MySQL's wire-format flags and character set; unused on PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wanted {
    pub user: Arc<str>,
    pub options: (u32, u8),
    pub database: Arc<str>,
}

/// A database's functions and when they were read.
type ReadAt = (Arc<Functions>, Instant);

#[derive(Debug)]
pub struct FunctionCatalog {
    ttl: Duration,
    /// Per database: its user-defined functions, and when they were read.
    known: RwLock<HashMap<Arc<str>, ReadAt>>,
    /// Databases asked for and not answered yet.
    pending: Mutex<HashSet<Arc<str>>>,
    /// Databases whose lookup failed, and when: not asked again before
    /// [`RETRY_AFTER`] (a login refused must not cost a query per read).
    failed: Mutex<HashMap<Arc<str>, Instant>>,
    queue: Mutex<Vec<Wanted>>,
    wake: Notify,
    /// Woken when a lookup ends (learned or failed).
    settled: Notify,
}

/// How long after a failed lookup a database is asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Most databases kept; the table is emptied when it fills.
const MAX_DATABASES: usize = 1_000;

impl FunctionCatalog {
    pub fn new(ttl: Duration) -> FunctionCatalog {
        FunctionCatalog {
            ttl,
            known: RwLock::default(),
            pending: Mutex::default(),
            failed: Mutex::default(),
            queue: Mutex::default(),
            wake: Notify::new(),
            settled: Notify::new(),
        }
    }

    /// Whether `database`'s functions are known (fresh or stale).
    pub fn knows(&self, database: &str) -> bool {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(database)
    }

    /// Asks for `database`'s functions (read with `user`'s login, or the
    /// health user's when `user` is empty), unless it is asked for already
    /// or its last lookup failed less than [`RETRY_AFTER`] ago.
    pub fn want(&self, user: &Arc<str>, options: (u32, u8), database: &str) {
        let backing_off = self
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(database)
            .is_some_and(|at| at.elapsed() < RETRY_AFTER);
        if backing_off {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.contains(database) {
            let database: Arc<str> = database.into();
            pending.insert(database.clone());
            self.queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Wanted {
                    user: user.clone(),
                    options,
                    database,
                });
            self.wake.notify_one();
        }
    }

    /// Waits until `database`'s functions are known, its lookup failed, or
    /// `limit` passed (a login to a database not read yet: its first reads
    /// are then routed by the catalog rather than sent to the primary).
    pub async fn wait_known(&self, database: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let waiting = self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(database);
            if self.knows(database) || !waiting {
                return;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return;
            }
        }
    }

    /// Whether a read of `user` on `database` calling `names` may go to a
    /// replica. Once the database's functions are known: unless one of the
    /// names is a user function that may write (a name that is not a user
    /// function is a built-in, or does not exist: a read). Not known yet:
    /// no, and they are asked for; stale: the old answer, and asked again.
    pub fn replica_ok(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.known_all(user, options, database, names, |functions, n| {
            functions.get(n) != Some(&FunctionKind::Write)
        })
    }

    /// Whether every name in `names` is a user function of `database` the
    /// server says is immutable (the result cache keeps reads calling only
    /// such). Not known yet: no, and asked for.
    pub fn all_immutable(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.known_all(user, options, database, names, |functions, n| {
            functions.get(n) == Some(&FunctionKind::Immutable)
        })
    }

    /// Whether every name in `names` is a built-in of `database` (no user
    /// function or procedure has it). Not known yet: no, and asked for.
    pub fn all_builtin(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.known_all(user, options, database, names, |functions, n| {
            !functions.contains_key(n)
        })
    }

    /// Whether `test` holds for every name, by `database`'s functions as
    /// read: false while they are not known; asks for them when unknown
    /// or stale (a stale answer is still used).
    fn known_all(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
        test: impl Fn(&Functions, &Arc<str>) -> bool,
    ) -> bool {
        let (ok, ask) = {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            match known.get(database) {
                Some((functions, at)) => (
                    names.iter().all(|n| test(functions, n)),
                    at.elapsed() >= self.ttl,
                ),
                None => (false, true),
            }
        };
        if ask {
            self.want(user, options, database);
        }
        ok
    }

    /// The decision for `unit`, a unit of `user` (with its protocol
    /// `options`) on `database`: a read calling functions no list decides
    /// becomes a primary read unless the catalog knows them all to be reads.
    pub fn decide(
        &self,
        unit: &fulcrum_sql::Classified,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
    ) -> fulcrum_sql::Decision {
        use fulcrum_sql::Decision;
        match &unit.functions {
            Some(names)
                if unit.decision == Decision::Read
                    && !self.replica_ok(user, options, database, names) =>
            {
                Decision::Primary
            }
            _ => unit.decision,
        }
    }

    /// Records the outcome of lookup `w` (`None`: it failed). A failed
    /// lookup as the health user (at start, after a failover) holds back
    /// nothing: the next client's login asks again with its own login.
    pub fn settle(&self, cluster: &str, w: Wanted, found: Option<Functions>) {
        match found {
            Some(functions) => {
                tracing::debug!(%cluster, database = %w.database, functions = functions.len(), "function catalog read");
                self.learned(w.database, functions);
            }
            None if w.user.is_empty() => {
                tracing::debug!(%cluster, database = %w.database, "function catalog: not read as the health user");
                self.pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&w.database);
                self.settled.notify_waiters();
            }
            None => self.failed(&w.database),
        }
    }

    /// The lookups to run now (empty when none; wait with [`Self::requested`]).
    pub fn wanted(&self) -> Vec<Wanted> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Resolves when lookups are queued.
    pub async fn requested(&self) {
        self.wake.notified().await
    }

    /// The server's answer for `database`.
    pub fn learned(&self, database: Arc<str>, functions: Functions) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&database);
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&database);
        {
            let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
            if known.len() >= MAX_DATABASES {
                known.clear();
            }
            known.insert(database, (Arc::new(functions), Instant::now()));
        }
        self.settled.notify_waiters();
    }

    /// A lookup failed: asked again by a read that needs it after
    /// [`RETRY_AFTER`] (its reads go to the primary meanwhile).
    pub fn failed(&self, database: &Arc<str>) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(database);
        {
            let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
            if failed.len() >= MAX_DATABASES {
                failed.clear();
            }
            failed.insert(database.clone(), Instant::now());
        }
        self.settled.notify_waiters();
    }

    /// The databases whose functions are known now.
    pub fn databases(&self) -> Vec<Arc<str>> {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// DDL went through Fulcrum (CREATE / ALTER / DROP FUNCTION, ...):
    /// every database is read again.
    pub fn forget(&self) {
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Databases whose functions are known.
    pub fn len(&self) -> usize {
        self.known.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Runs `look_up` for each lookup `catalog` wants, until `stop` turns
/// true (the context's health loop stopped: shutdown, or a reload's next
/// context took over). One at a time: lookups are rare (once per function
/// per TTL). `databases` are asked for at once, and again (with every
/// database known by then) whenever `primary` names another server.
pub fn start_lookups<F, Fut, P>(
    catalog: Arc<FunctionCatalog>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    databases: Vec<Arc<str>>,
    primary: P,
    look_up: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Wanted) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
    P: Fn() -> Option<usize> + Send + 'static,
{
    let by_health_user: Arc<str> = "".into();
    for database in &databases {
        catalog.want(&by_health_user, (0, 0), database);
    }
    tokio::spawn(async move {
        let mut last_primary = primary();
        loop {
            let now = primary();
            if now != last_primary && now.is_some() {
                // A failover: read everything again on the new primary.
                last_primary = now;
                let mut all = catalog.databases();
                all.extend(databases.iter().cloned());
                for database in all {
                    catalog.want(&by_health_user, (0, 0), &database);
                }
            }
            for w in catalog.wanted() {
                look_up(w).await;
            }
            tokio::select! {
                _ = catalog.requested() => {}
                _ = stop.changed() => {}
                // Also picks up lookups queued while the last ones ran.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if *stop.borrow() {
                return;
            }
        }
    })
}

/// A name safe to put in a single-quoted SQL literal (function names the
/// parser gave: identifiers, possibly quoted ones).
pub fn quote_literal(name: &str) -> String {
    format!("'{}'", name.replace('\'', "''").replace('\\', "\\\\"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Arc<str> {
        s.into()
    }

    #[test]
    fn reads_go_to_the_primary_until_the_databases_functions_are_known() {
        let c = FunctionCatalog::new(Duration::from_secs(60));
        let (u, db) = (n("app"), n("app"));
        assert!(
            !c.replica_ok(&u, (0, 0), &db, &[n("bump")]),
            "not known yet"
        );
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        let wanted = c.wanted();
        assert_eq!(wanted.len(), 1, "the database is asked once: {wanted:?}");
        assert_eq!(wanted[0].database, db);
        c.learned(
            db.clone(),
            Functions::from([
                (n("bump"), FunctionKind::Write),
                (n("price"), FunctionKind::Read),
            ]),
        );
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("bump")]), "it writes");
        assert!(c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert!(
            c.replica_ok(&u, (0, 0), &db, &[n("json_detailed")]),
            "not a user function: a built-in"
        );
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price"), n("bump")]));
        assert!(c.wanted().is_empty(), "known: nothing to ask");
        assert!(
            !c.replica_ok(&u, (0, 0), &n("other"), &[n("price")]),
            "per database"
        );
    }

    #[test]
    fn stale_answers_are_kept_while_asked_again_and_ddl_forgets() {
        let c = FunctionCatalog::new(Duration::ZERO);
        let (u, db) = (n("app"), n("app"));
        c.learned(
            db.clone(),
            Functions::from([(n("price"), FunctionKind::Read)]),
        );
        assert!(
            c.replica_ok(&u, (0, 0), &db, &[n("price")]),
            "stale but read"
        );
        assert_eq!(c.wanted().len(), 1, "refreshed");
        c.forget();
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        c.failed(&db);
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert!(
            c.wanted().is_empty(),
            "not asked again right after a failure"
        );
        c.failed
            .lock()
            .unwrap()
            .insert(db.clone(), Instant::now() - RETRY_AFTER);
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert_eq!(c.wanted().len(), 1, "asked again after RETRY_AFTER");
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(quote_literal("f"), "'f'");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
