//! The pool's unit tests: reuse, lifetime, waiting and timeouts, the
//! reserve, budgets, `fill`, `retire` and `server_check_delay` checks.

use super::*;

struct Conn {
    id: u32,
    usable: bool,
}
impl Poolable for Conn {
    fn is_usable(&mut self) -> bool {
        self.usable
    }
    /// A dead server still looks usable to the cheap check (id 0).
    async fn check(&mut self) -> bool {
        self.id != 0
    }
}

fn pool(size: u32, timeout_ms: u64) -> Pool<Conn> {
    Pool::new(
        size,
        Duration::from_millis(timeout_ms),
        Duration::from_secs(60),
    )
}

async fn open(id: u32) -> Result<Conn, String> {
    Ok(Conn { id, usable: true })
}

#[tokio::test]
async fn released_connection_is_reused() {
    let p = pool(2, 100);
    let c = p.get(|| open(1)).await.unwrap();
    c.release();
    let c = p.get(|| open(2)).await.unwrap();
    assert_eq!(c.id, 1);
    assert_eq!(p.stats().opened, 1);
}

#[tokio::test]
async fn connections_past_their_lifetime_are_closed_not_reused() {
    let p = pool(2, 100).with_lifetime(Some(Duration::from_millis(50)));
    let c = p.get(|| open(1)).await.unwrap();
    c.release();
    let c = p.get(|| open(2)).await.unwrap();
    assert_eq!(c.id, 1, "young enough: reused");
    // Past it by more than the coarse clock's tick.
    tokio::time::sleep(Duration::from_millis(120)).await;
    c.release();
    assert_eq!(p.stats().closed, 1, "closed when it came back too old");
    let c = p.get(|| open(3)).await.unwrap();
    assert_eq!(c.id, 3);
    c.release();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let c = p.get(|| open(4)).await.unwrap();
    assert_eq!(c.id, 4, "an idle one past its lifetime is not handed out");
    assert_eq!(p.stats().closed, 2);
    // No lifetime: kept.
    let q = pool(1, 100).with_lifetime(None);
    let c = q.get(|| open(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.release();
    assert_eq!(q.get(|| open(6)).await.unwrap().id, 5);
}

#[tokio::test]
async fn dropped_connection_is_never_reused() {
    let p = pool(1, 100);
    let c = p.get(|| open(1)).await.unwrap();
    drop(c);
    let c = p.get(|| open(2)).await.unwrap();
    assert_eq!(c.id, 2);
    assert_eq!(p.stats().closed, 1);
}

#[tokio::test]
async fn unusable_idle_connection_is_replaced() {
    let p = pool(1, 100);
    let mut c = p.get(|| open(1)).await.unwrap();
    c.usable = false;
    c.release();
    let c = p.get(|| open(2)).await.unwrap();
    assert_eq!(c.id, 2);
}

#[tokio::test]
async fn waiter_times_out_with_clear_error() {
    let p = pool(1, 50);
    let _held = p.get(|| open(1)).await.unwrap();
    let err = p.get(|| open(2)).await.err().unwrap();
    assert!(matches!(err, PoolError::Timeout(_, 1)), "{err}");
    assert!(err.to_string().contains("waiting for a server connection"));
}

#[tokio::test]
async fn waiter_gets_released_connection() {
    let p = pool(1, 2000);
    let held = p.get(|| open(1)).await.unwrap();
    let p2 = p.clone();
    let waiter = tokio::spawn(async move { p2.get(|| open(2)).await.map(|c| c.id) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    held.release();
    assert_eq!(waiter.await.unwrap().unwrap(), 1);
    assert_eq!(p.stats().opened, 1);
}

#[tokio::test]
async fn connect_error_frees_the_permit() {
    let p = pool(1, 50);
    let r = p
        .get(|| async { Err::<Conn, _>("refused".to_string()) })
        .await;
    assert!(matches!(r, Err(PoolError::Connect(_))));
    assert!(p.get(|| open(3)).await.is_ok());
}

#[tokio::test]
async fn backend_load_counts_checked_out_connections() {
    let load = Arc::new(AtomicUsize::new(0));
    let p: Pool<Conn> = Pool::with_load(
        3,
        Duration::from_millis(50),
        Duration::from_secs(60),
        load.clone(),
    );
    let a = p.get(|| open(1)).await.unwrap();
    let b = p.get(|| open(2)).await.unwrap();
    assert_eq!(load.load(Ordering::Relaxed), 2);
    a.release();
    b.discard();
    assert_eq!(load.load(Ordering::Relaxed), 0);
    let c = p.get(|| open(3)).await.unwrap();
    assert_eq!(load.load(Ordering::Relaxed), 1);
    drop(c);
    assert_eq!(load.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn never_more_than_size_connections() {
    let p = pool(3, 1000);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let c = p.get(|| open(i)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            assert!(p.stats().in_use <= 3);
            c.release();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s = p.stats();
    assert!(s.opened <= 3, "{s:?}");
    assert_eq!(s.idle as u64, s.opened);
}

fn settings(size: u32, timeout_ms: u64) -> PoolSettings {
    PoolSettings::new(
        size,
        Duration::from_millis(timeout_ms),
        Duration::from_secs(60),
    )
}

#[tokio::test]
async fn the_reserve_serves_a_client_that_waited_reserve_timeout() {
    let p: Pool<Conn> = Pool::configured(
        PoolSettings {
            reserve_size: 1,
            reserve_timeout: Duration::from_millis(100),
            ..settings(1, 1000)
        },
        Arc::new(AtomicUsize::new(0)),
        Vec::new(),
        None,
    );
    let _held = p.get(|| open(1)).await.unwrap();
    let started = Instant::now();
    let extra = p.get(|| open(2)).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(waited < Duration::from_millis(900), "{waited:?}");
    assert_eq!(extra.id, 2);
    let s = p.stats();
    assert_eq!((s.in_use, s.reserve), (2, 1), "{s:?}");
    // Both the pool and its reserve are in use: the next one times out.
    let err = p.get(|| open(3)).await.err().unwrap();
    assert!(matches!(err, PoolError::Timeout(_, 1)), "{err}");
    drop(extra);
    assert_eq!(p.stats().reserve, 0);
}

#[tokio::test]
async fn a_budget_caps_connections_across_pools_and_closes_idle_ones_for_room() {
    let db = Budget::new(2, "max_db_connections (2) for database \"app\"");
    let load = Arc::new(AtomicUsize::new(0));
    let a: Pool<Conn> = Pool::configured(settings(5, 200), load.clone(), vec![db.clone()], None);
    let b: Pool<Conn> = Pool::configured(settings(5, 200), load.clone(), vec![db.clone()], None);
    let a1 = a.get(|| open(1)).await.unwrap();
    let a2 = a.get(|| open(2)).await.unwrap();
    assert_eq!(db.open(), 2);
    // At the cap with both in use: b waits, then gets a clear error.
    let err = b.get(|| open(3)).await.err().unwrap();
    assert!(matches!(err, PoolError::Budget(..)), "{err}");
    assert!(err.to_string().contains("max_db_connections (2)"), "{err}");
    // One of a's goes idle: b closes it to make room.
    a1.release();
    assert_eq!((a.stats().idle, db.open()), (1, 2));
    let b1 = b.get(|| open(4)).await.unwrap();
    assert_eq!(b1.id, 4);
    assert_eq!((a.stats().idle, a.stats().closed, db.open()), (0, 1, 2));
    // A waiter gets the permit of a connection that closes.
    let b2 = b.clone();
    let waiter = tokio::spawn(async move { b2.get(|| open(5)).await.map(|c| c.id) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(a2);
    assert_eq!(waiter.await.unwrap().unwrap(), 5);
    drop(b1);
    assert_eq!(
        db.open(),
        0,
        "every permit back once the connections closed"
    );
}

#[tokio::test]
async fn fill_keeps_min_size_open_within_size_and_budgets() {
    let user = Budget::new(3, "max_user_connections (3) for user \"app\"");
    let p: Pool<Conn> = Pool::configured(
        PoolSettings {
            min_size: 2,
            ..settings(4, 100)
        },
        Arc::new(AtomicUsize::new(0)),
        vec![user.clone()],
        None,
    );
    assert_eq!(p.fill(|| open(9)).await.unwrap(), 2);
    assert_eq!((p.stats().idle, p.stats().opened), (2, 2));
    assert_eq!(p.fill(|| open(9)).await.unwrap(), 0, "already at min");
    // In-use connections count: two checked out, none opened.
    let c1 = p.get(|| open(10)).await.unwrap();
    let c2 = p.get(|| open(11)).await.unwrap();
    assert_eq!(p.fill(|| open(9)).await.unwrap(), 0);
    c1.discard();
    assert_eq!(
        p.fill(|| open(9)).await.unwrap(),
        1,
        "one closed: one opened"
    );
    // The budget bounds it too: 3 open under a cap of 3.
    let q: Pool<Conn> = Pool::configured(
        PoolSettings {
            min_size: 2,
            ..settings(4, 100)
        },
        Arc::new(AtomicUsize::new(0)),
        vec![user.clone()],
        None,
    );
    assert_eq!(user.open(), 2);
    assert_eq!(q.fill(|| open(9)).await.unwrap(), 1, "room for one only");
    assert_eq!(user.open(), 3);
    drop(c2);
    let failed = q.fill(|| async { Err::<Conn, _>("refused") }).await;
    assert_eq!(failed, Err("refused"));
}

#[tokio::test]
async fn retire_closes_idle_now_and_in_use_when_released() {
    let p = pool(3, 100);
    let a = p.get(|| open(1)).await.unwrap();
    let b = p.get(|| open(2)).await.unwrap();
    let c = p.get(|| open(3)).await.unwrap();
    c.release();
    p.retire();
    assert_eq!(
        (p.stats().idle, p.retiring()),
        (0, 2),
        "idle closed, two to go"
    );
    a.release();
    assert_eq!(
        (p.stats().idle, p.retiring()),
        (0, 1),
        "closed on its way back"
    );
    drop(b);
    assert_eq!(p.retiring(), 0);
    let d = p.get(|| open(4)).await.unwrap();
    assert_eq!(d.id, 4, "a fresh one");
    d.release();
    assert_eq!(
        p.stats().idle,
        1,
        "connections opened after RECONNECT are kept"
    );
}

#[tokio::test]
async fn an_idle_connection_past_check_delay_is_checked_and_replaced_when_dead() {
    let outcomes: Arc<Mutex<Vec<bool>>> = Arc::default();
    let seen = outcomes.clone();
    let p: Pool<Conn> = Pool::configured(
        PoolSettings {
            check_delay: Some(Duration::from_millis(30)),
            ..settings(2, 200)
        },
        Arc::new(AtomicUsize::new(0)),
        Vec::new(),
        Some(Arc::new(move |passed| seen.lock().unwrap().push(passed))),
    );
    p.get(|| open(0)).await.unwrap().release();
    // Fresh: handed out without a check, dead or not.
    let c = p.get(|| open(1)).await.unwrap();
    assert_eq!(c.id, 0);
    c.release();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let c = p.get(|| open(2)).await.unwrap();
    assert_eq!(c.id, 2, "the dead one failed its check and was closed");
    assert_eq!(p.stats().closed, 1);
    c.release();
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(p.get(|| open(3)).await.unwrap().id, 2, "a live one passes");
    assert_eq!(
        *outcomes.lock().unwrap(),
        vec![false, true],
        "the hook hears each check: the dead one failed, the live one passed"
    );
}

#[tokio::test]
async fn a_worker_reuses_its_own_connections_and_another_workers_only_when_full() {
    // The tokio test runs on one thread: it plays worker 1, then worker 2.
    let p = pool(2, 100);
    crate::worker::enter(1);
    p.get(|| open(1)).await.unwrap().release();
    crate::worker::enter(2);
    let c = p.get(|| open(2)).await.unwrap();
    assert_eq!(c.id, 2, "room for one more: worker 2 opens its own");
    c.release();
    let c = p.get(|| open(3)).await.unwrap();
    assert_eq!(c.id, 2, "its own idle connection first");
    // Pool full (one idle of worker 1's, one in use): worker 2 takes worker 1's.
    let d = p.get(|| open(4)).await.unwrap();
    assert_eq!(d.id, 1);
    assert_eq!(p.stats().opened, 2);
    c.release();
    d.release();
    crate::worker::enter(1);
    let c = p.get(|| open(5)).await.unwrap();
    assert_eq!(c.id, 1, "the connection went back as worker 1's");
    crate::worker::enter(crate::worker::NONE);
}

/// A connection that names its server process, as a protocol's does.
struct Named(u64);
impl Poolable for Named {
    fn is_usable(&mut self) -> bool {
        true
    }
    fn identity(&self) -> ServerIdentity {
        ServerIdentity {
            remote_pid: self.0,
            ..Default::default()
        }
    }
}

fn listed(cluster: &str) -> Vec<(u64, &'static str, bool)> {
    servers::snapshot()
        .into_iter()
        .filter(|r| &*r.labels.cluster == cluster)
        .map(|r| (r.identity.remote_pid, r.state.as_str(), r.close_needed))
        .collect()
}

#[tokio::test]
async fn show_servers_lists_each_open_connection_and_its_state() {
    let labels = |cluster: &str| PoolLabels {
        cluster: cluster.into(),
        backend: "127.0.0.1:5432".into(),
        user: "u".into(),
        database: "d".into(),
    };
    let p: Pool<Named> =
        Pool::new(2, Duration::from_millis(100), Duration::from_secs(60)).labelled(labels("s1"));
    let a = p
        .get(|| async { Ok::<_, String>(Named(41)) })
        .await
        .unwrap();
    let b = p
        .get(|| async { Ok::<_, String>(Named(42)) })
        .await
        .unwrap();
    assert_eq!(listed("s1"), [(41, "active", false), (42, "active", false)]);
    a.release();
    assert_eq!(listed("s1"), [(41, "idle", false), (42, "active", false)]);
    assert_eq!(
        p.stats().used,
        0,
        "no server_check_delay: nothing is `used`"
    );
    b.discard();
    assert_eq!(listed("s1"), [(41, "idle", false)], "a closed one is gone");
    let a = p
        .get(|| async { Ok::<_, String>(Named(43)) })
        .await
        .unwrap();
    assert_eq!(listed("s1"), [(41, "active", false)], "reused, not opened");
    p.retire();
    assert_eq!(listed("s1"), [(41, "active", true)], "closed once back");
    a.release();
    assert_eq!(listed("s1"), []);
    drop(p);

    // Idle past server_check_delay: `used` (checked before its next use).
    let mut settings = PoolSettings::new(1, Duration::from_millis(100), Duration::from_secs(60));
    settings.check_delay = Some(Duration::ZERO);
    let p: Pool<Named> =
        Pool::configured(settings, Arc::default(), Vec::new(), None).labelled(labels("s2"));
    assert_eq!(p.fill(|| async { Ok::<_, String>(Named(7)) }).await, Ok(0));
    p.get(|| async { Ok::<_, String>(Named(7)) })
        .await
        .unwrap()
        .release();
    assert_eq!(listed("s2"), [(7, "used", false)]);
    // SHOW POOLS counts it the same way (sv_used, not sv_idle).
    let s = p.stats();
    assert_eq!((s.idle, s.used), (1, 1));
    // An unlabelled pool is not listed.
    let q: Pool<Named> = Pool::new(1, Duration::from_millis(100), Duration::from_secs(60));
    let _c = q.get(|| async { Ok::<_, String>(Named(8)) }).await.unwrap();
    assert!(servers::snapshot()
        .iter()
        .all(|r| r.identity.remote_pid != 8));
}

/// `try_get`: an idle connection at once, or nothing (none idle, every
/// permit held, or a check due), never a new connection.
#[tokio::test]
async fn try_get_takes_only_a_ready_idle_connection() {
    let p = pool(1, 100);
    assert!(p.try_get().is_none(), "none idle: nothing opened");
    assert_eq!(p.stats().opened, 0);
    let c = p.get(|| open(1)).await.unwrap();
    assert!(p.try_get().is_none(), "the one permit is held");
    c.release();
    let c = p.try_get().expect("the idle one");
    assert_eq!(c.id, 1);
    c.release();
    let checked: Pool<Conn> = Pool::configured(
        PoolSettings {
            check_delay: Some(Duration::ZERO),
            ..settings(1, 100)
        },
        Arc::new(AtomicUsize::new(0)),
        Vec::new(),
        None,
    );
    checked.get(|| open(2)).await.unwrap().release();
    assert!(checked.try_get().is_none(), "a check is due: left to get");
    let c = checked.get(|| open(3)).await.unwrap();
    assert_eq!(c.id, 2, "put back where it was, and checked by get");
}

#[tokio::test]
async fn a_checkout_waiting_at_a_budgets_cap_takes_a_connection_its_pool_gets_back() {
    // max_user_connections (2) under a pool_size of 5: the third client
    // waits, and is served by the first connection given back, long
    // before the pool_timeout.
    let user = Budget::new(2, "max_user_connections (2) for user \"app\"");
    let p: Pool<Conn> = Pool::configured(
        settings(5, 5_000),
        Arc::new(AtomicUsize::new(0)),
        vec![user.clone()],
        None,
    );
    let c1 = p.get(|| open(1)).await.unwrap();
    let _c2 = p.get(|| open(2)).await.unwrap();
    let p2 = p.clone();
    let waiter = tokio::spawn(async move { p2.get(|| open(3)).await.map(|c| c.id) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "at the cap: it waits");
    let started = Instant::now();
    c1.release();
    let got = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("served before the pool_timeout")
        .unwrap()
        .unwrap();
    assert_eq!(got, 1, "the connection given back, not a new one");
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(p.stats().opened, 2, "no third connection was opened");
}

/// A connection given back keeps its permit on the idle list while nobody
/// waits (`permits.rs`): that permit counts as free, the limit holds.
#[tokio::test]
async fn a_permit_parked_with_an_idle_connection_is_free_and_the_limit_holds() {
    let p = pool(2, 50);
    let a = p.get(|| open(1)).await.unwrap();
    let b = p.get(|| open(2)).await.unwrap();
    a.release();
    let s = p.stats();
    assert_eq!((s.idle, s.in_use), (1, 1), "{s:?}");
    let a = p.try_get().expect("the idle one, with its parked permit");
    assert_eq!(a.id, 1);
    assert!(p.try_get().is_none(), "both in use");
    let err = p.get(|| open(3)).await.err().unwrap();
    assert!(matches!(err, PoolError::Timeout(_, 2)), "{err}");
    a.release();
    b.release();
    assert_eq!(p.stats().in_use, 0);
    // Two parked permits, taken by `get` as well as `try_get`.
    let (c, d) = (
        p.get(|| open(4)).await.unwrap(),
        p.get(|| open(5)).await.unwrap(),
    );
    assert_eq!((c.id, d.id), (2, 1), "most recent first; nothing opened");
    assert_eq!(p.stats().opened, 2);
}

/// A connection given back while a client waits releases its permit to
/// that waiter (FIFO): a newcomer's `try_get` gets nothing meanwhile.
#[tokio::test]
async fn a_waiter_is_served_before_a_newcomer_when_a_connection_comes_back() {
    let p = pool(1, 2000);
    let held = p.get(|| open(1)).await.unwrap();
    let p2 = p.clone();
    let waiter = tokio::spawn(async move {
        let c = p2.get(|| open(2)).await?;
        let id = c.id;
        c.release();
        Ok::<_, PoolError<String>>(id)
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    held.release();
    assert!(p.try_get().is_none(), "the permit is the waiter's");
    assert_eq!(waiter.await.unwrap().unwrap(), 1);
    assert_eq!(p.stats().opened, 1);
    // Served: it waits no more, so the next one given back is parked.
    p.try_get()
        .expect("parked with the idle connection")
        .release();
    assert_eq!((p.stats().idle, p.stats().in_use), (1, 0));
}
