//! What "often" should mean for `mode = "auto"` (issue 46): synthetic read
//! traces replayed through the real result cache (`fulcrum_cache::Cache`:
//! its LRU, its byte budget, its accounting of what an entry costs) with a
//! key admitted to the cache at its 1st, 2nd, 3rd, 4th or 8th miss.
//!
//! ```text
//! cargo bench --bench cache_admission
//! ```
//!
//! Deterministic: each trace comes from a fixed seed (splitmix64), so two
//! runs print the same table; nothing is timed. Traces: Zipf with s = 0.8,
//! 1.0 and 1.2, and uniform, over 10,000 and 100,000 keys, 1,000,000
//! lookups each (`FULCRUM_ADMISSION_LOOKUPS` overrides), with `max_memory`
//! set to 10 % and to 50 % of what every key's entry would take together.
//! Answers are 64 to 319 bytes (by the key's hash), keys about 40 bytes,
//! no writes, a TTL longer than the trace: what is measured is admission
//! against eviction alone.
//!
//! Threshold 1 is the cache's `second_miss = false` (a rule's reads) and 2
//! is `second_miss = true` (`auto` today), both decided inside the cache.
//! 3, 4 and 8 are counted here: the lookup runs with `second_miss = false`
//! and the bench keeps the fill only at the key's k-th miss, remembering
//! miss counts by key for at most 65,536 keys, forgotten together when
//! full, as the cache remembers first misses. The same counting at k = 2
//! is run too and must give exactly what the cache's own rule gives (the
//! bench fails otherwise): the emulation is the cache's rule.
//!
//! Per run: hit ratio (hits / lookups), fills (entries stored), bytes
//! written by fills (key + answer, what the fills copied), fills wasted
//! (entries evicted before any hit; entries never hit and still held at
//! the end counted apart), and the bytes held at the end. Report on stdout
//! and in `target/bench-cache-admission.md`; docs/routing.md ("Cache") and
//! docs/benchmarks.md read it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use fulcrum_cache::{Cache, CacheMetrics, Limits, Lookup, Query, Table};

/// Keys whose miss count the emulated thresholds remember, as the cache
/// remembers first misses (`SEEN_ONCE_MAX` in fulcrum-cache's store).
const SEEN_MAX: usize = 65_536;
/// The admission thresholds compared: a key is stored at its k-th miss.
const THRESHOLDS: [u32; 5] = [1, 2, 3, 4, 8];
/// Lookups per trace unless `FULCRUM_ADMISSION_LOOKUPS` says otherwise.
const LOOKUPS: usize = 1_000_000;
/// Key-space sizes.
const KEY_COUNTS: [usize; 2] = [10_000, 100_000];
/// `max_memory` as a share of what all keys' entries take together.
const BUDGETS: [f64; 2] = [0.10, 0.50];

/// A trace's key distribution.
#[derive(Clone, Copy)]
enum Dist {
    Zipf(f64),
    Uniform,
}

impl Dist {
    fn name(self) -> String {
        match self {
            Dist::Zipf(s) => format!("Zipf s={s}"),
            Dist::Uniform => "uniform".into(),
        }
    }
}

/// splitmix64: a fixed, dependency-free stream of 64-bit values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The trace: `lookups` key ids in `0..keys` drawn from `dist`. Rank r
/// (0 the most popular) is key id r: ids carry no other meaning.
fn trace(dist: Dist, keys: usize, lookups: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    match dist {
        Dist::Uniform => (0..lookups)
            .map(|_| (rng.next() % keys as u64) as u32)
            .collect(),
        Dist::Zipf(s) => {
            let mut cdf = Vec::with_capacity(keys);
            let mut total = 0.0;
            for r in 1..=keys {
                total += 1.0 / (r as f64).powf(s);
                cdf.push(total);
            }
            (0..lookups)
                .map(|_| {
                    let u = rng.unit() * total;
                    cdf.partition_point(|&c| c <= u).min(keys - 1) as u32
                })
                .collect()
        }
    }
}

/// Key `id`'s cache key (about 40 bytes, as a point select's text and
/// parameter would make) and its answer's length (64 to 319 bytes).
fn key_of(id: u32) -> (Vec<u8>, usize) {
    let key = format!("SELECT c FROM sbtest1 WHERE id=?\0{id:08}").into_bytes();
    let mut h = Rng(u64::from(id) ^ 0xA5A5_5A5A);
    (key, 64 + (h.next() % 256) as usize)
}

/// What one replay counted.
#[derive(Default, Clone, PartialEq, Debug)]
struct Outcome {
    hits: u64,
    fills: u64,
    fill_bytes: u64,
    /// Entries evicted before any hit.
    wasted: u64,
    /// Entries never hit and still held at the end.
    unhit_at_end: u64,
    bytes_at_end: u64,
}

/// How a replay decides admission.
#[derive(Clone, Copy)]
enum Admission {
    /// The cache's own rule: `second_miss` false (k = 1) or true (k = 2).
    Cache { second_miss: bool },
    /// Counted here: stored at the k-th miss.
    Counted(u32),
}

/// Replays `ids` through a fresh cache of `max_memory` bytes.
fn replay(ids: &[u32], keys: &[(Vec<u8>, usize)], max_memory: u64, adm: Admission) -> Outcome {
    let cache = Cache::new(
        Limits {
            max_memory,
            max_result: u64::MAX,
            needs_stream: false,
        },
        CacheMetrics::default(),
    );
    let tables: Vec<Table> = vec![fulcrum_cache::table("db", "sbtest1", true)];
    let second_miss = matches!(adm, Admission::Cache { second_miss: true });
    let mut misses: HashMap<u32, u32> = HashMap::new();
    // Entries this replay believes held, with their hits so far. No TTL
    // runs out and nothing is written, so a held key that misses was
    // evicted.
    let mut held: HashMap<u32, u64> = HashMap::new();
    let mut out = Outcome::default();
    for &id in ids {
        let (key, answer_len) = &keys[id as usize];
        let q = Query {
            key,
            database: "db",
            digest: 1,
            text: "SELECT c FROM sbtest1 WHERE id = ?",
            tables: &tables,
            ttl: Duration::from_secs(24 * 3600),
            second_miss,
        };
        match cache.lookup(&q, false) {
            Lookup::Hit(_) => {
                out.hits += 1;
                *held.get_mut(&id).expect("a hit is of a stored entry") += 1;
            }
            Lookup::Fill(fill) => {
                if held.remove(&id) == Some(0) {
                    out.wasted += 1;
                }
                let admit = match adm {
                    Admission::Cache { .. } => true,
                    Admission::Counted(k) => counted_admits(&mut misses, id, k),
                };
                if admit && fill.store(Bytes::from(vec![b'r'; *answer_len])) {
                    out.fills += 1;
                    out.fill_bytes += (key.len() + answer_len) as u64;
                    held.insert(id, 0);
                }
            }
            Lookup::Off => {
                // The cache's own second-miss rule turned down a first miss.
                if held.remove(&id) == Some(0) {
                    out.wasted += 1;
                }
            }
            Lookup::Wait(_) => unreachable!("one client: no fill is ever under way"),
        }
    }
    // What the replay believes held may have been evicted since its last
    // lookup: probe each (the trace is over, so the probes change nothing
    // counted). Every entry the cache holds must be one of them.
    out.bytes_at_end = cache.bytes();
    let entries = cache.len();
    let mut still_held = 0;
    let mut ids: Vec<(u32, u64)> = held.into_iter().collect();
    ids.sort_unstable();
    for (id, hits) in ids {
        let q = Query {
            key: &keys[id as usize].0,
            database: "db",
            digest: 1,
            text: "SELECT c FROM sbtest1 WHERE id = ?",
            tables: &tables,
            ttl: Duration::from_secs(24 * 3600),
            second_miss: false,
        };
        let held_now = matches!(cache.lookup(&q, false), Lookup::Hit(_));
        still_held += usize::from(held_now);
        match (hits, held_now) {
            (0, true) => out.unhit_at_end += 1,
            (0, false) => out.wasted += 1,
            _ => {}
        }
    }
    assert_eq!(entries, still_held, "the replay's view of what is held");
    out
}

/// The k-th miss admits; misses are remembered for at most [`SEEN_MAX`]
/// keys, all forgotten when a new key would exceed it (the cache's way).
fn counted_admits(misses: &mut HashMap<u32, u32>, id: u32, k: u32) -> bool {
    if k <= 1 {
        return true;
    }
    match misses.get_mut(&id) {
        Some(n) if *n + 1 >= k => {
            misses.remove(&id);
            true
        }
        Some(n) => {
            *n += 1;
            false
        }
        None => {
            if misses.len() >= SEEN_MAX {
                misses.clear();
            }
            misses.insert(id, 1);
            false
        }
    }
}

/// Bytes the cache counts for every key's entry held at once.
fn footprint(keys: &[(Vec<u8>, usize)]) -> u64 {
    let ids: Vec<u32> = (0..keys.len() as u32).collect();
    replay(
        &ids,
        keys,
        u64::MAX,
        Admission::Cache { second_miss: false },
    )
    .bytes_at_end
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("cache admission: not run outside `cargo bench --bench cache_admission`");
        return;
    }
    let lookups = std::env::var("FULCRUM_ADMISSION_LOOKUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LOOKUPS);
    let dists = [
        Dist::Zipf(0.8),
        Dist::Zipf(1.0),
        Dist::Zipf(1.2),
        Dist::Uniform,
    ];
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{lookups} lookups per trace; `max_memory` as a share of every key's entry held at \
         once; hit ratio per threshold k (stored at the k-th miss), the best in bold; then, \
         per k, fills / bytes written by fills (MB) / fills wasted (evicted before any hit) \
         / never hit and still held at the end.\n"
    );
    let _ = writeln!(
        report,
        "| trace | keys | max_memory | hit ratio k=1 | k=2 | k=3 | k=4 | k=8 | fills, MB \
         written, wasted, unhit held: k=1 | k=2 | k=3 | k=4 | k=8 |"
    );
    let _ = writeln!(
        report,
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"
    );
    for &n in &KEY_COUNTS {
        let keys: Vec<(Vec<u8>, usize)> = (0..n as u32).map(key_of).collect();
        let all = footprint(&keys);
        for (d, &dist) in dists.iter().enumerate() {
            let ids = trace(dist, n, lookups, 0x46 + d as u64 * 1000 + n as u64);
            for &share in &BUDGETS {
                let max_memory = (all as f64 * share) as u64;
                let outcomes: Vec<Outcome> = THRESHOLDS
                    .iter()
                    .map(|&k| {
                        let adm = match k {
                            1 => Admission::Cache { second_miss: false },
                            2 => Admission::Cache { second_miss: true },
                            k => Admission::Counted(k),
                        };
                        replay(&ids, &keys, max_memory, adm)
                    })
                    .collect();
                // The emulation at k = 2 must be the cache's own rule.
                let counted_2 = replay(&ids, &keys, max_memory, Admission::Counted(2));
                assert_eq!(
                    counted_2,
                    outcomes[1],
                    "{} over {n} keys: counting at k = 2 differs from the cache's second-miss rule",
                    dist.name()
                );
                let best = outcomes.iter().map(|o| o.hits).max().unwrap_or(0);
                let ratios: Vec<String> = outcomes
                    .iter()
                    .map(|o| {
                        let r = format!("{:.3}", o.hits as f64 / lookups as f64);
                        if o.hits == best {
                            format!("**{r}**")
                        } else {
                            r
                        }
                    })
                    .collect();
                let fills: Vec<String> = outcomes
                    .iter()
                    .map(|o| {
                        format!(
                            "{} / {:.1} / {} / {}",
                            o.fills,
                            o.fill_bytes as f64 / 1e6,
                            o.wasted,
                            o.unhit_at_end
                        )
                    })
                    .collect();
                let line = format!(
                    "| {} | {n} | {:.0} % ({:.2} MB) | {} | {} |",
                    dist.name(),
                    share * 100.0,
                    max_memory as f64 / 1e6,
                    ratios.join(" | "),
                    fills.join(" | ")
                );
                eprintln!("{line}");
                let _ = writeln!(report, "{line}");
            }
        }
    }
    println!("\n{report}");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let path = dir.join("bench-cache-admission.md");
    match std::fs::write(&path, &report) {
        Ok(()) => eprintln!("written to {}", path.display()),
        Err(e) => eprintln!("writing {}: {e}", path.display()),
    }
}
