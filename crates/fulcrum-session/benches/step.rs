//! One engine step for a pgbench -S unit, classification cached: the
//! routing decision and the state transitions of a read from an idle
//! client (attach, answer, detach). Target: under 1 µs (docs/benchmarks-history.md).

use criterion::{criterion_group, criterion_main, Criterion};
use fulcrum_session::{decide, Engine, Event, Facts, Owed, Status};
use fulcrum_sql::{Classifier, ClassifierConfig, Decision, Dialect};
use std::hint::black_box;

fn step(c: &mut Criterion) {
    let classifier = Classifier::new(
        Dialect::Postgres,
        &ClassifierConfig {
            cache_size: 1000,
            ..Default::default()
        },
    );
    let sql = "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;";
    assert_eq!(classifier.classify(sql), Decision::Read);
    c.bench_function("engine step: pgbench -S unit (classified, cached)", |b| {
        let mut engine = Engine::new(None);
        b.iter(|| {
            let decision = classifier.classify(black_box(sql));
            let routing = decide(&Facts::idle(decision));
            let a = engine.step(Event::Unit(routing));
            let d = engine.step(Event::Ready {
                status: Status::Idle,
                owed: Owed::Nothing,
            });
            black_box((a, d))
        })
    });
    c.bench_function("engine step: decide and step only", |b| {
        let mut engine = Engine::new(None);
        b.iter(|| {
            let routing = decide(&Facts::idle(black_box(Decision::Read)));
            let a = engine.step(Event::Unit(routing));
            let d = engine.step(Event::Ready {
                status: Status::Idle,
                owed: Owed::Nothing,
            });
            black_box((a, d))
        })
    });
}

criterion_group!(benches, step);
criterion_main!(benches);
