//! The store's promises, each shown on its own: hits, the fill race, one
//! fill per key, invalidation by table, database and stream, TTL, the byte
//! budget, and the statistics.

use std::time::Duration;

use bytes::Bytes;

use crate::*;

fn cache(max_memory: u64, needs_stream: bool) -> Cache {
    Cache::new(
        Limits {
            max_memory,
            max_result: 1000,
            needs_stream,
        },
        CacheMetrics::default(),
    )
}

fn t(name: &str) -> Table {
    table("app", name, false)
}

fn q<'a>(key: &'a [u8], tables: &'a [Table]) -> Query<'a> {
    Query {
        key,
        database: "app",
        digest: 7,
        text: "select v from t where id = $1",
        tables,
        ttl: Duration::from_secs(60),
        second_miss: false,
    }
}

fn fill(c: &Cache, key: &[u8], tables: &[Table]) -> Fill {
    match c.lookup(&q(key, tables), true) {
        Lookup::Fill(f) => f,
        _ => panic!("expected a fill"),
    }
}

fn hit(c: &Cache, key: &[u8], tables: &[Table]) -> Option<Bytes> {
    match c.lookup(&q(key, tables), false) {
        Lookup::Hit(b) => Some(b),
        Lookup::Fill(_) | Lookup::Off | Lookup::Wait(_) => None,
    }
}

#[test]
fn a_stored_answer_is_served_byte_for_byte() {
    let c = cache(1 << 20, false);
    let tables = [t("t")];
    assert!(fill(&c, b"k", &tables).store(Bytes::from_static(b"answer")));
    assert_eq!(hit(&c, b"k", &tables).as_deref(), Some(&b"answer"[..]));
    assert_eq!(hit(&c, b"other", &tables), None);
    let rows = c.digests();
    assert_eq!((rows[0].hits, rows[0].misses, rows[0].entries), (1, 2, 1));
}

#[test]
fn a_write_during_the_fill_keeps_it_from_being_stored() {
    let c = cache(1 << 20, false);
    let tables = [t("t"), t("u")];
    let f = fill(&c, b"k", &tables);
    c.invalidate([&t("u")], Source::Proxy);
    assert!(!f.store(Bytes::from_static(b"old")), "overtaken by a write");
    assert_eq!(c.races(), 1);
    assert!(hit(&c, b"k", &tables).is_none());
    // A write to another table does not stop a fill.
    let f = fill(&c, b"k", &tables);
    c.invalidate([&t("x")], Source::Proxy);
    assert!(f.store(Bytes::from_static(b"new")));
    // Nor one to the same name in another database.
    let f = fill(&c, b"k2", &tables);
    c.invalidate([&table("other", "t", false)], Source::Stream);
    assert!(f.store(Bytes::from_static(b"new")));
}

#[test]
fn a_write_drops_its_tables_entries_and_only_theirs() {
    let c = cache(1 << 20, false);
    assert!(fill(&c, b"a", &[t("t")]).store(Bytes::from_static(b"1")));
    assert!(fill(&c, b"b", &[t("t"), t("u")]).store(Bytes::from_static(b"2")));
    assert!(fill(&c, b"c", &[t("u")]).store(Bytes::from_static(b"3")));
    c.invalidate([&t("t")], Source::Proxy);
    assert!(hit(&c, b"a", &[t("t")]).is_none());
    assert!(hit(&c, b"b", &[t("t"), t("u")]).is_none());
    assert!(hit(&c, b"c", &[t("u")]).is_some());
    assert_eq!(c.len(), 1);
    c.invalidate_database("app", Source::Proxy);
    assert!(c.is_empty());
    assert_eq!(c.bytes(), 0);
}

#[test]
fn a_database_wide_write_stops_fills_of_that_database_only() {
    let c = cache(1 << 20, false);
    let f = fill(&c, b"a", &[t("t")]);
    let g = fill(&c, b"b", &[table("other", "t", false)]);
    c.invalidate_database("app", Source::Proxy);
    assert!(!f.store(Bytes::from_static(b"1")));
    assert!(g.store(Bytes::from_static(b"2")));
}

#[tokio::test]
async fn one_fill_per_key_and_the_others_wait_for_it() {
    let c = cache(1 << 20, false);
    let tables = [t("t")];
    let f = fill(&c, b"k", &tables);
    let Lookup::Wait(w) = c.lookup(&q(b"k", &tables), true) else {
        panic!("a second lookup waits for the fill");
    };
    assert!(matches!(c.lookup(&q(b"k", &tables), false), Lookup::Off));
    let waiting = tokio::spawn(w.wait());
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    assert!(f.store(Bytes::from_static(b"v")));
    waiting.await.unwrap();
    assert!(hit(&c, b"k", &tables).is_some());
    // A fill given up (the read failed) wakes the waiters too.
    let f = fill(&c, b"j", &tables);
    let Lookup::Wait(w) = c.lookup(&q(b"j", &tables), true) else {
        panic!("waits");
    };
    drop(f);
    w.wait().await;
    assert!(matches!(c.lookup(&q(b"j", &tables), true), Lookup::Fill(_)));
}

#[test]
fn entries_expire_at_their_ttl() {
    let c = cache(1 << 20, false);
    let tables = [t("t")];
    let mut query = q(b"k", &tables);
    query.ttl = Duration::from_millis(50);
    let Lookup::Fill(f) = c.lookup(&query, true) else {
        panic!()
    };
    assert!(f.store(Bytes::from_static(b"v")));
    assert!(hit(&c, b"k", &tables).is_some());
    // `Instant::now()` is the real clock: wait for real.
    std::thread::sleep(Duration::from_millis(60));
    assert!(hit(&c, b"k", &tables).is_none());
    assert_eq!(c.digests()[0].invalidations[Source::Ttl as usize], 1);
}

#[test]
fn the_byte_budget_evicts_the_least_recently_used() {
    // Each entry: 192 + 1 key + 100 answer + 64 per table = 357 bytes.
    let c = cache(800, false);
    let tables = [t("t")];
    let answer = Bytes::from(vec![b'x'; 100]);
    assert!(fill(&c, b"a", &tables).store(answer.clone()));
    assert!(fill(&c, b"b", &tables).store(answer.clone()));
    assert!(hit(&c, b"a", &tables).is_some(), "a is now the most recent");
    assert!(fill(&c, b"c", &tables).store(answer.clone()));
    assert!(c.bytes() <= 800);
    assert!(
        hit(&c, b"b", &tables).is_none(),
        "b was the least recently used"
    );
    assert!(hit(&c, b"a", &tables).is_some());
    assert!(hit(&c, b"c", &tables).is_some());
    // Over max_result: not kept.
    assert!(!fill(&c, b"d", &tables).store(Bytes::from(vec![0; 1001])));
}

#[test]
fn with_a_stream_nothing_is_served_while_it_is_down() {
    let c = cache(1 << 20, true);
    let tables = [t("t")];
    assert!(matches!(c.lookup(&q(b"k", &tables), true), Lookup::Off));
    assert_eq!(c.wanted_streams(), vec![Arc::<str>::from("app")]);
    assert!(c.wanted_streams().is_empty(), "asked for once");
    c.set_stream_up("app", true);
    let f = fill(&c, b"k", &tables);
    assert!(f.store(Bytes::from_static(b"v")));
    let g = fill(&c, b"j", &tables);
    c.set_stream_up("other", false);
    assert_eq!(c.len(), 1, "another database's stream is not this one's");
    c.set_stream_up("app", false);
    assert!(c.is_empty(), "going down drops the database's entries");
    assert!(
        !g.store(Bytes::from_static(b"v")),
        "a fill across the loss is not kept"
    );
    assert!(!c.serving("app"));
    c.set_stream_up("app", true);
    assert!(hit(&c, b"k", &tables).is_none());
    c.without_stream();
    assert!(c.serving("new") && !c.uses_streams());
}

#[test]
fn flush_by_table_name_or_all() {
    let c = cache(1 << 20, false);
    assert!(fill(&c, b"a", &[t("t")]).store(Bytes::from_static(b"1")));
    assert!(fill(&c, b"b", &[table("x", "t", false)]).store(Bytes::from_static(b"1")));
    assert!(fill(&c, b"c", &[t("u")]).store(Bytes::from_static(b"1")));
    assert_eq!(c.flush(Some("public.T")), 2);
    assert_eq!(c.flush(None), 1);
    assert!(c.is_empty());
}

#[test]
fn table_names_as_invalidation_knows_them() {
    assert_eq!(
        table("app", "public.T", false),
        (Arc::from("app"), Arc::from("t"))
    );
    assert_eq!(table("app", "t", true), (Arc::from("app"), Arc::from("t")));
    assert_eq!(
        table("app", "shop.t", true),
        (Arc::from("shop"), Arc::from("t"))
    );
}

#[test]
fn auto_mode_fills_a_key_at_its_second_miss() {
    let c = cache(1 << 20, false);
    let tables = [t("t")];
    let mut query = q(b"k", &tables);
    query.second_miss = true;
    assert!(matches!(c.lookup(&query, true), Lookup::Off), "first miss");
    let Lookup::Fill(f) = c.lookup(&query, true) else {
        panic!("the second miss fills");
    };
    assert!(f.store(Bytes::from_static(b"v")));
    assert!(matches!(c.lookup(&query, true), Lookup::Hit(_)));
    assert_eq!(c.digests()[0].misses, 2);
}
