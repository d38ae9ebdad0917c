//! Classifier cost: a cached hit and an uncached parse for pgbench's and
//! sysbench's statements. Targets: cached <= 1 us, uncached <= 20 us.

use criterion::{criterion_group, criterion_main, Criterion};
use fulcrum_sql::{Classifier, ClassifierConfig, Dialect};
use std::hint::black_box;

const PG: &[(&str, &str)] = &[
    ("pgbench_select", "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;"),
    ("pgbench_update", "UPDATE pgbench_accounts SET abalance = abalance + -3061 WHERE aid = 48213;"),
    ("pgbench_insert", "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (7, 1, 48213, -3061, CURRENT_TIMESTAMP);"),
];
const MY: &[(&str, &str)] = &[
    ("sysbench_point", "SELECT c FROM sbtest1 WHERE id=5012"),
    (
        "sysbench_range_order",
        "SELECT c FROM sbtest1 WHERE id BETWEEN 4991 AND 5090 ORDER BY c",
    ),
    ("sysbench_update", "UPDATE sbtest1 SET k=k+1 WHERE id=5000"),
];

fn bench(c: &mut Criterion) {
    for (dialect, cases) in [(Dialect::Postgres, PG), (Dialect::MySql, MY)] {
        let cached = Classifier::new(
            dialect,
            &ClassifierConfig {
                cache_size: 1024,
                ..Default::default()
            },
        );
        for (name, sql) in cases {
            cached.classify(sql);
            c.bench_function(&format!("classify_cached/{name}"), |b| {
                b.iter(|| cached.classify(black_box(sql)))
            });
            c.bench_function(&format!("classify_uncached/{name}"), |b| {
                b.iter(|| cached.parse(black_box(sql)))
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
