//! Every client connection logged in now, in every cluster, for the admin
//! console's `SHOW CLIENTS` (one row per client, PgBouncer's columns). One
//! process-wide registry, so clients still served by a cluster's old context
//! after a reload are listed too. A session updates its entry with one
//! atomic store when it attaches or releases a server connection.
//!
//! An entry is also how a session learns it must stop: the console's
//! `KILL`, the drain on shutdown and the hand-over of a binary upgrade
//! raise a flag on it and wake the session, which watches them with one
//! [`Watcher`] (an atomic load per wake-up, not a lock).

use fulcrum_net::ClientPeer;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use crate::client_stats::{ClientCounts, Totals};

/// What a client is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientState {
    /// Between units of work, holding no server connection.
    Idle = 0,
    /// A unit of work holds a server connection.
    Active = 1,
    /// Waiting for a server connection.
    Waiting = 2,
}

impl ClientState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientState::Idle => "idle",
            ClientState::Active => "active",
            ClientState::Waiting => "waiting",
        }
    }
}

const NO_BACKEND: usize = usize::MAX;

/// One client connection.
#[derive(Debug)]
pub struct ClientEntry {
    pub id: u64,
    pub cluster: Arc<str>,
    pub user: Arc<str>,
    pub database: Arc<str>,
    /// Its address, or the Unix socket it came in on with the peer's uid.
    pub peer: ClientPeer,
    /// Milliseconds since the Unix epoch.
    pub connected_ms: u64,
    state: AtomicU8,
    backend: AtomicUsize,
    /// When the state last changed (ms since the Unix epoch).
    since_ms: AtomicU64,
    /// [`KILLED`], [`DRAIN`] and [`HAND_OVER`], as raised.
    interrupts: AtomicU8,
    /// Why the session stays on this process after an upgrade asked for
    /// its hand-over ([`Stay`] as a byte; 0: it has not declined).
    stays: AtomicU8,
    /// The session's task, woken when a flag is raised.
    waker: Mutex<Option<Waker>>,
    /// What its units did (SHOW STATS' rows per database).
    pub counts: ClientCounts,
}

/// Raised by the admin console's KILL: the session ends at once.
const KILLED: u8 = 1;
/// Raised on shutdown: the session ends at its next transaction boundary.
const DRAIN: u8 = 2;
/// Raised once a binary upgrade's new process serves: the session moves
/// to it at its next transaction boundary (`crate::handover`).
const HAND_OVER: u8 = 4;

/// Why a client asked to move to the new process stays on this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stay {
    /// Its TLS session cannot move between processes (no kernel TLS).
    Tls,
    /// It holds state Fulcrum cannot move (a pin: temporary tables,
    /// session locks, session pooling); it moves once it unpins.
    Pinned,
}

/// Why a session must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// The admin console's KILL.
    Killed,
    /// Shutdown (SIGTERM): at the next transaction boundary.
    Drain,
    /// A binary upgrade: move to the new process at the next transaction
    /// boundary.
    HandOver,
}

impl ClientEntry {
    pub fn state(&self) -> ClientState {
        match self.state.load(Ordering::Relaxed) {
            1 => ClientState::Active,
            2 => ClientState::Waiting,
            _ => ClientState::Idle,
        }
    }

    /// The backend the client's unit of work is on, when active.
    pub fn backend(&self) -> Option<usize> {
        Some(self.backend.load(Ordering::Relaxed)).filter(|&b| b != NO_BACKEND)
    }

    /// When the state last changed (ms since the Unix epoch).
    pub fn since_ms(&self) -> u64 {
        self.since_ms.load(Ordering::Relaxed)
    }

    fn set(&self, state: ClientState, backend: usize) {
        self.backend.store(backend, Ordering::Relaxed);
        self.state.store(state as u8, Ordering::Relaxed);
        self.since_ms
            .store(fulcrum_pool::coarse::unix_ms(), Ordering::Relaxed);
    }

    /// Ends the client's session (admin `KILL`): it is told and closed.
    pub fn kill(&self) {
        self.raise(KILLED);
    }

    /// The session ends at its next transaction boundary (shutdown).
    pub fn drain(&self) {
        self.raise(DRAIN);
    }

    /// The drain was raised.
    pub fn draining(&self) -> bool {
        self.interrupts.load(Ordering::Acquire) & DRAIN != 0
    }

    /// A drain or a hand-over was raised: the session checks, at its
    /// transaction boundaries, which (one load for both).
    pub fn leaving(&self) -> bool {
        self.interrupts.load(Ordering::Acquire) & (DRAIN | HAND_OVER) != 0
    }

    /// A binary upgrade asked the session to move to the new process.
    pub fn handing_over(&self) -> bool {
        self.interrupts.load(Ordering::Acquire) & HAND_OVER != 0
    }

    /// The session stays on this process (asked to move, it cannot);
    /// `None`: it has not declined, or no longer stays for that reason.
    pub fn set_stay(&self, why: Option<Stay>) {
        let byte = match why {
            None => 0,
            Some(Stay::Tls) => 1,
            Some(Stay::Pinned) => 2,
        };
        self.stays.store(byte, Ordering::Relaxed);
    }

    /// Why it stays, when it declined to move.
    pub fn stay(&self) -> Option<Stay> {
        match self.stays.load(Ordering::Relaxed) {
            1 => Some(Stay::Tls),
            2 => Some(Stay::Pinned),
            _ => None,
        }
    }

    fn raise(&self, flag: u8) {
        self.interrupts.fetch_or(flag, Ordering::AcqRel);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = waker.as_ref() {
            w.wake_by_ref();
        }
    }

    /// A unit of work now holds a connection to `backend`.
    pub fn set_active(&self, backend: usize) {
        self.set(ClientState::Active, backend);
    }

    /// The client waits for a server connection.
    pub fn set_waiting(&self) {
        self.set(ClientState::Waiting, NO_BACKEND);
    }

    /// The client holds no server connection.
    pub fn set_idle(&self) {
        if self.state.load(Ordering::Relaxed) != ClientState::Idle as u8 {
            self.set(ClientState::Idle, NO_BACKEND);
        }
    }
}

/// The clients logged in now.
#[derive(Debug, Default)]
pub struct ClientRegistry {
    next: AtomicU64,
    /// Shutdown: every client, present and to come, drains.
    draining: AtomicBool,
    /// A binary upgrade: every client, present and to come (a login that
    /// was under way), moves to the new process.
    handing_over: AtomicBool,
    map: Mutex<HashMap<u64, Arc<ClientEntry>>>,
    /// Databases (as clients name them) whose new logins are refused:
    /// the console's `DISABLE <database>`, PgBouncer's meaning.
    disabled_databases: Mutex<std::collections::HashSet<String>>,
    /// The counts of the clients that left, per (cluster, database);
    /// taken after `map`'s lock, never before it.
    departed: Mutex<HashMap<DatabaseKey, Totals>>,
}

/// A database as its clients named it: (cluster, database).
pub type DatabaseKey = (Arc<str>, Arc<str>);

/// A registered client; dropping it removes the entry.
#[derive(Debug)]
pub struct ClientHandle {
    entry: Arc<ClientEntry>,
    registry: &'static ClientRegistry,
}

impl std::ops::Deref for ClientHandle {
    type Target = ClientEntry;
    fn deref(&self) -> &ClientEntry {
        &self.entry
    }
}

impl ClientHandle {
    /// The entry itself, for a task that outlives a borrow of the handle.
    pub fn clone_entry(&self) -> Arc<ClientEntry> {
        self.entry.clone()
    }

    /// What the session polls to learn of a KILL or the drain.
    pub fn watcher(&self) -> Watcher {
        Watcher {
            entry: self.entry.clone(),
            seen: 0,
            registered: None,
        }
    }
}

/// A session's watch on its entry's interrupts. Polling it costs an
/// atomic load while the session's waker stays the same (it is stored on
/// the entry once, not on every poll).
#[derive(Debug)]
pub struct Watcher {
    entry: Arc<ClientEntry>,
    /// Interrupts already reported (each is reported once).
    seen: u8,
    /// The waker stored on the entry.
    registered: Option<Waker>,
}

impl Watcher {
    /// Ready with an interrupt not reported before; otherwise the task is
    /// woken when one is raised.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Interrupt> {
        if let Some(i) = self.fresh() {
            return Poll::Ready(i);
        }
        if !self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            let waker = cx.waker().clone();
            *self.entry.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker.clone());
            self.registered = Some(waker);
            // Raised before the waker was stored: seen now.
            if let Some(i) = self.fresh() {
                return Poll::Ready(i);
            }
        }
        Poll::Pending
    }

    /// Resolves with the next interrupt not reported before.
    pub async fn next(&mut self) -> Interrupt {
        std::future::poll_fn(|cx| self.poll(cx)).await
    }

    fn fresh(&mut self) -> Option<Interrupt> {
        let raised = self.entry.interrupts.load(Ordering::Acquire) & !self.seen;
        if raised & KILLED != 0 {
            self.seen |= KILLED;
            Some(Interrupt::Killed)
        } else if raised & DRAIN != 0 {
            self.seen |= DRAIN;
            Some(Interrupt::Drain)
        } else if raised & HAND_OVER != 0 {
            self.seen |= HAND_OVER;
            Some(Interrupt::HandOver)
        } else {
            None
        }
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        // One that stayed on this process after an upgrade is gone now.
        if let (Some(why), Some(sink)) = (self.entry.stay(), crate::handover::sink()) {
            sink.gone(why);
        }
        let mut map = self.registry.map.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&self.entry.id);
        // Under the map's lock: a SHOW STATS sees the client in one place.
        let e = &self.entry;
        self.registry
            .departed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((e.cluster.clone(), e.database.clone()))
            .or_default()
            .add(&e.counts.totals());
    }
}

/// The process's registry.
pub fn registry() -> &'static ClientRegistry {
    static REGISTRY: OnceLock<ClientRegistry> = OnceLock::new();
    REGISTRY.get_or_init(ClientRegistry::default)
}

impl ClientRegistry {
    /// Registers a client that just logged in (idle).
    pub fn register(
        &'static self,
        cluster: &str,
        user: Arc<str>,
        database: Arc<str>,
        peer: ClientPeer,
    ) -> ClientHandle {
        let now = fulcrum_pool::coarse::unix_ms();
        let entry = Arc::new(ClientEntry {
            id: self.next.fetch_add(1, Ordering::Relaxed) + 1,
            cluster: cluster.into(),
            user,
            database,
            peer,
            connected_ms: now,
            state: AtomicU8::new(ClientState::Idle as u8),
            backend: AtomicUsize::new(NO_BACKEND),
            since_ms: AtomicU64::new(now),
            interrupts: AtomicU8::new(0),
            stays: AtomicU8::new(0),
            waker: Mutex::new(None),
            counts: ClientCounts::default(),
        });
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(entry.id, entry.clone());
        // Under the map's lock, so a drain under way cannot miss it.
        if self.draining.load(Ordering::Acquire) {
            entry.interrupts.fetch_or(DRAIN, Ordering::AcqRel);
        }
        if self.handing_over.load(Ordering::Acquire) {
            entry.interrupts.fetch_or(HAND_OVER, Ordering::AcqRel);
        }
        ClientHandle {
            entry,
            registry: self,
        }
    }

    /// Shutdown: every session ends at its next transaction boundary
    /// (and one logging in now, as soon as it starts).
    pub fn drain_all(&self) {
        self.draining.store(true, Ordering::Release);
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for entry in map.values() {
            entry.drain();
        }
    }

    /// A binary upgrade's new process serves: every session moves to it
    /// at its next transaction boundary (those that can), and one logging
    /// in now as soon as it starts.
    pub fn hand_over_all(&self) {
        self.handing_over.store(true, Ordering::Release);
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for entry in map.values() {
            entry.raise(HAND_OVER);
        }
    }

    /// `DISABLE <database>` (true) or `ENABLE <database>` (false): new
    /// logins to `database` are refused while it is disabled; connected
    /// clients stay.
    pub fn set_database_disabled(&self, database: &str, disabled: bool) {
        let mut set = self
            .disabled_databases
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if disabled {
            set.insert(database.to_owned());
        } else {
            set.remove(database);
        }
    }

    /// Whether new logins to `database` are refused now.
    pub fn is_database_disabled(&self, database: &str) -> bool {
        let set = self
            .disabled_databases
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        !set.is_empty() && set.contains(database)
    }

    /// Each (cluster, database)'s counts: its departed clients' and its
    /// connected clients', in one consistent look.
    pub fn database_totals(&self) -> Vec<(DatabaseKey, Totals)> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = self
            .departed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for e in map.values() {
            all.entry((e.cluster.clone(), e.database.clone()))
                .or_default()
                .add(&e.counts.totals());
        }
        drop(map);
        let mut rows: Vec<_> = all.into_iter().collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// Every client, oldest first.
    pub fn snapshot(&self) -> Vec<Arc<ClientEntry>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map.values().cloned().collect();
        all.sort_by_key(|e| e.id);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_listed_while_connected_with_their_state() {
        let r: &'static ClientRegistry = Box::leak(Box::default());
        let peer = ClientPeer::Tcp("127.0.0.1:5000".parse().unwrap());
        let a = r.register("main", "app".into(), "db".into(), peer.clone());
        let b = r.register("main", "ro".into(), "db".into(), peer);
        assert_eq!(r.snapshot().len(), 2);
        a.set_waiting();
        assert_eq!(a.state(), ClientState::Waiting);
        a.set_active(2);
        assert_eq!((a.state(), a.backend()), (ClientState::Active, Some(2)));
        a.set_idle();
        assert_eq!((a.state(), a.backend()), (ClientState::Idle, None));
        drop(b);
        let left = r.snapshot();
        assert_eq!(left.len(), 1);
        assert_eq!(&*left[0].user, "app");
    }

    #[test]
    fn a_databases_totals_keep_the_counts_of_clients_that_left() {
        let r: &'static ClientRegistry = Box::leak(Box::default());
        let peer = ClientPeer::Tcp("127.0.0.1:5000".parse().unwrap());
        let a = r.register("main", "app".into(), "shop".into(), peer.clone());
        let b = r.register("main", "app".into(), "shop".into(), peer.clone());
        let c = r.register("main", "app".into(), "crm".into(), peer);
        a.counts.queries(3);
        b.counts.queries(4);
        c.counts.queries(5);
        drop(a);
        let rows = r.database_totals();
        let of = |db: &str| {
            rows.iter()
                .find(|((_, d), _)| &**d == db)
                .map(|(_, t)| t.queries)
        };
        assert_eq!(of("shop"), Some(7), "departed and connected: {rows:?}");
        assert_eq!(of("crm"), Some(5));
        drop(b);
        drop(c);
        let rows = r.database_totals();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows.iter().map(|(_, t)| t.queries).sum::<u64>(), 12);
    }

    #[tokio::test]
    async fn a_watcher_reports_the_drain_then_a_kill_each_once() {
        let r: &'static ClientRegistry = Box::leak(Box::default());
        let peer = ClientPeer::Tcp("127.0.0.1:5000".parse().unwrap());
        let a = r.register("main", "app".into(), "db".into(), peer.clone());
        let mut watch = a.watcher();
        let waiting = tokio::spawn(async move {
            let first = watch.next().await;
            let second = watch.next().await;
            (first, second)
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        r.drain_all();
        assert!(a.draining());
        tokio::task::yield_now().await;
        a.kill();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(seen, (Interrupt::Drain, Interrupt::Killed));
        // A client logging in during the drain drains at once.
        let b = r.register("main", "late".into(), "db".into(), peer);
        assert!(b.draining());
        assert_eq!(b.watcher().next().await, Interrupt::Drain);
    }
}
