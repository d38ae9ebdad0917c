//! The routing corpus: every statement in tests/corpus/<dialect>.txt is
//! classified and compared with its expected label (format in
//! tests/corpus/README.md). All mismatches are reported at once.

use fulcrum_sql::{Classifier, ClassifierConfig, Dialect};

fn check(file: &str, dialect: Dialect, minimum: usize) {
    let path = format!("{}/tests/corpus/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let classifier = Classifier::new(
        dialect,
        &ClassifierConfig {
            cache_size: 4096,
            ..Default::default()
        },
    );
    let mut cases = 0;
    let mut wrong = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (label, sql) = line
            .split_once(" | ")
            .unwrap_or_else(|| panic!("{file}:{}: expected `<label> | <statement>`", n + 1));
        let sql = sql.replace("\\n", "\n");
        cases += 1;
        // Twice: the second answer comes from the cache and must agree.
        for round in ["parsed", "cached"] {
            let got = classifier.classify(&sql).label();
            if got != label.trim() {
                wrong.push(format!(
                    "{file}:{}: expected {label}, got {got} ({round}): {sql}",
                    n + 1
                ));
            }
        }
    }
    assert!(
        cases >= minimum,
        "{file}: only {cases} cases, want at least {minimum}"
    );
    assert!(
        wrong.is_empty(),
        "{} of {cases} cases wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    eprintln!("{file}: {cases} cases");
}

#[test]
fn postgres_corpus_routes_as_expected() {
    check("postgres.txt", Dialect::Postgres, 300);
}

#[test]
fn mysql_corpus_routes_as_expected() {
    check("mysql.txt", Dialect::MySql, 300);
}
