//! `[cluster.cache]` and `[[cluster.cache.rule]]`: the values they give,
//! their defaults, and each invalid value's `file:line: key: reason`.

use std::time::Duration;

use super::{assert_errors, dedent, MINIMAL};
use crate::{Cache, CacheInvalidation, CacheIsolation, CacheMode, CacheRule};

/// `MINIMAL` followed by `tail` (indented as `MINIMAL` is): a
/// `[cluster.cache]` header written first is on line 11, its first key on
/// line 12.
fn with(tail: &str) -> String {
    let tail: Vec<String> = tail.lines().map(|l| format!("    {l}\n")).collect();
    format!("{MINIMAL}{}", tail.concat())
}

fn cache_of(tail: &str) -> Cache {
    let config = crate::parse(&dedent(&with(tail)), std::path::Path::new("fulcrum.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    config.clusters[0].cache.clone()
}

#[test]
fn a_full_section_gives_its_values() {
    let cache = cache_of(
        r#"[cluster.cache]
mode = "rules"
max_memory = "64MB"
ttl = "2m"
max_result = "512kB"
isolation = "shared"
invalidation = "proxy"
[[cluster.cache.rule]]
tables = ["pgbench_accounts", "Public.Branches"]
ttl = "30s"
in_transactions = true
[[cluster.cache.rule]]
tables = ["t"]"#,
    );
    assert_eq!(
        cache,
        Cache {
            mode: CacheMode::Rules,
            max_memory: 64 << 20,
            ttl: Duration::from_secs(120),
            max_result: 512 << 10,
            isolation: CacheIsolation::Shared,
            invalidation: CacheInvalidation::Proxy,
            rules: vec![
                CacheRule {
                    tables: vec!["pgbench_accounts".into(), "public.branches".into()],
                    ttl: Some(Duration::from_secs(30)),
                    in_transactions: true,
                },
                CacheRule {
                    tables: vec!["t".into()],
                    ttl: None,
                    in_transactions: false,
                },
            ],
        }
    );
    assert!(cache.enabled());
    // Stored lower case, so the statement's (lower-cased) names match.
    assert!(cache.rule_for(["public.branches"]).is_some());
    assert_eq!(
        cache.rule_for(["t"]).map(|r| r.ttl),
        Some(None),
        "the second rule, with the cluster's ttl"
    );
}

#[test]
fn without_the_section_or_its_keys_the_cache_is_off_with_the_defaults() {
    let absent = cache_of("");
    assert_eq!(absent, Cache::default());
    assert_eq!(
        absent,
        Cache {
            mode: CacheMode::Off,
            max_memory: 256 << 20,
            ttl: Duration::from_secs(60),
            max_result: 1 << 20,
            isolation: CacheIsolation::User,
            invalidation: CacheInvalidation::Stream,
            rules: vec![],
        }
    );
    assert!(!absent.enabled());
    assert_eq!(cache_of("[cluster.cache]"), Cache::default());
}

#[test]
fn other_modes_and_inline_tables() {
    // `auto` needs no rule; rules are kept with `off` (ready to turn on).
    assert_eq!(
        cache_of("[cluster.cache]\nmode = \"auto\"").mode,
        CacheMode::Auto
    );
    let off = cache_of("[cluster.cache]\nmode = \"off\"\n[[cluster.cache.rule]]\ntables = [\"a\"]");
    assert_eq!((off.mode, off.rules.len()), (CacheMode::Off, 1));
    let text = MINIMAL.replace(
        "listen = \"127.0.0.1:6432\"",
        "listen = \"127.0.0.1:6432\"\n    cache = { mode = \"rules\", max_memory = 1048576, rule = [{ tables = [\"s.a\"], ttl = \"60s\" }] }",
    );
    let config = crate::parse(&dedent(&text), std::path::Path::new("fulcrum.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let inline = &config.clusters[0].cache;
    assert_eq!(inline.max_memory, 1 << 20);
    assert_eq!(inline.rules[0].tables, vec!["s.a".to_string()]);
    assert_eq!(inline.rules[0].ttl, Some(Duration::from_secs(60)));
    // `isolation = "user"` and `invalidation = "stream"` written out.
    let written = cache_of("[cluster.cache]\nisolation = \"user\"\ninvalidation = \"stream\"");
    assert_eq!(written, Cache::default());
}

#[test]
fn invalid_values_name_the_file_line_and_key() {
    let rule = |keys: &str| with(&format!("[cluster.cache]\n[[cluster.cache.rule]]\n{keys}"));
    assert_errors(&[
        (
            &with("[cluster.cache]\nmode = \"on\""),
            "fulcrum.toml:12: cluster[0].cache.mode: unknown value \"on\", expected one of \"off\", \"rules\", \"auto\"",
        ),
        (
            &with("[cluster.cache]\nisolation = \"team\""),
            "fulcrum.toml:12: cluster[0].cache.isolation: unknown value \"team\", expected one of \"user\", \"shared\"",
        ),
        (
            &with("[cluster.cache]\ninvalidation = \"wal\""),
            "fulcrum.toml:12: cluster[0].cache.invalidation: unknown value \"wal\", expected one of \"stream\", \"proxy\"",
        ),
        (
            &with("[cluster.cache]\nmax_memory = 0"),
            "fulcrum.toml:12: cluster[0].cache.max_memory: must be greater than zero",
        ),
        (
            &with("[cluster.cache]\nmax_memory = \"256mb\""),
            "fulcrum.toml:12: cluster[0].cache.max_memory: invalid size \"256mb\": unknown unit \"mb\", expected one of B, kB (or KB), MB, GB, TB (1024-based)",
        ),
        (
            &with("[cluster.cache]\nmax_result = \"0MB\""),
            "fulcrum.toml:12: cluster[0].cache.max_result: must be greater than zero",
        ),
        (
            &with("[cluster.cache]\nmax_memory = \"1MB\"\nmax_result = \"2MB\""),
            "fulcrum.toml:12: cluster[0].cache.max_memory: must be at least max_result (2097152 bytes)",
        ),
        (
            &with("[cluster.cache]\nmax_result = \"512MB\""),
            "fulcrum.toml:12: cluster[0].cache.max_result: must not exceed max_memory (268435456 bytes, the default)",
        ),
        (
            &with("[cluster.cache]\nttl = \"0s\""),
            "fulcrum.toml:12: cluster[0].cache.ttl: must be greater than zero",
        ),
        (
            &with("[cluster.cache]\nttl = \"60\""),
            "fulcrum.toml:12: cluster[0].cache.ttl: invalid duration \"60\": missing unit (us, ms, s, m, h), e.g. \"60s\"",
        ),
        // Read with the cache off too: a typo waits for no one.
        (
            &with("[cluster.cache]\nmode = \"off\"\nttl = \"1.5s\""),
            "fulcrum.toml:13: cluster[0].cache.ttl: invalid duration \"1.5s\": fractions are not supported; use a smaller unit, e.g. \"1500ms\"",
        ),
        (
            &with("[cluster.cache]\nmode = \"rules\""),
            "fulcrum.toml:12: cluster[0].cache.mode: mode = \"rules\" caches nothing without a [[cluster.cache.rule]]",
        ),
        (
            &with("[cluster.cache]\nmode = \"rules\"\nrule = []"),
            "fulcrum.toml:12: cluster[0].cache.mode: mode = \"rules\" caches nothing without a [[cluster.cache.rule]]",
        ),
        (
            &rule("ttl = \"5s\""),
            "fulcrum.toml:12: cluster[0].cache.rule[0].tables: required key is missing",
        ),
        (
            &rule("tables = []"),
            "fulcrum.toml:13: cluster[0].cache.rule[0].tables: must list at least one table (`table` or `schema.table`)",
        ),
        (
            &rule("tables = [\"a\", \"\"]"),
            "fulcrum.toml:13: cluster[0].cache.rule[0].tables: \"\" is not a table name (`table` or `schema.table`, no spaces)",
        ),
        (
            &rule("tables = [\"db.public.a\"]"),
            "fulcrum.toml:13: cluster[0].cache.rule[0].tables: \"db.public.a\" is not a table name (`table` or `schema.table`, no spaces)",
        ),
        (
            &rule("tables = [\"my table\"]"),
            "fulcrum.toml:13: cluster[0].cache.rule[0].tables: \"my table\" is not a table name (`table` or `schema.table`, no spaces)",
        ),
        (
            &rule("tables = [\"public.\"]"),
            "fulcrum.toml:13: cluster[0].cache.rule[0].tables: \"public.\" is not a table name (`table` or `schema.table`, no spaces)",
        ),
        (
            &rule("tables = [\"a\"]\nttl = \"0s\""),
            "fulcrum.toml:14: cluster[0].cache.rule[0].ttl: must be greater than zero",
        ),
        (
            &rule("tables = [\"a\"]\nin_transactions = \"yes\""),
            "fulcrum.toml:14: cluster[0].cache.rule[0].in_transactions: invalid type: string \"yes\", expected a boolean",
        ),
    ]);
}

#[test]
fn a_rule_ttl_above_the_clusters_is_rejected() {
    assert_errors(&[
        (
            &with("[cluster.cache]\n[[cluster.cache.rule]]\ntables = [\"a\"]\nttl = \"90s\""),
            "fulcrum.toml:14: cluster[0].cache.rule[0].ttl: \"90s\" is above [cluster.cache] ttl (60s, the default): a rule's ttl may only shorten the cluster's",
        ),
        (
            &with("[cluster.cache]\nttl = \"1m\"\n[[cluster.cache.rule]]\ntables = [\"a\"]\n[[cluster.cache.rule]]\ntables = [\"b\"]\nttl = \"2m\""),
            "fulcrum.toml:17: cluster[0].cache.rule[1].ttl: \"2m\" is above [cluster.cache] ttl = \"1m\": a rule's ttl may only shorten the cluster's",
        ),
    ]);
    // Equal to the cluster's is allowed.
    let equal = cache_of(
        "[cluster.cache]\nttl = \"1m\"\n[[cluster.cache.rule]]\ntables = [\"a\"]\nttl = \"60s\"",
    );
    assert_eq!(equal.rules[0].ttl, Some(Duration::from_secs(60)));
}

#[test]
fn unknown_keys_are_rejected_with_a_suggestion() {
    assert_errors(&[
        (
            &with("[cluster.cache]\nmdoe = \"auto\""),
            "fulcrum.toml:12: cluster[0].cache.mdoe: unknown key `mdoe`: did you mean `mode`?",
        ),
        (
            &with("[cluster.cache]\nmax_results = \"1MB\""),
            "fulcrum.toml:12: cluster[0].cache.max_results: unknown key `max_results`: did you mean `max_result`?",
        ),
        (
            &with("[cluster.cache]\ncolour = 1"),
            "fulcrum.toml:12: cluster[0].cache.colour: unknown key `colour`, expected one of `mode`, `max_memory`, `ttl`, `max_result`, `isolation`, `invalidation`, `rule`",
        ),
        (
            &with("[cluster.cache]\n[[cluster.cache.rule]]\ntable = [\"a\"]"),
            "fulcrum.toml:13: cluster[0].cache.rule[0].table: unknown key `table`: did you mean `tables`?",
        ),
        (
            &with("[cluster.cache]\n[[cluster.cache.rule]]\ntables = [\"a\"]\nin_transaction = true"),
            "fulcrum.toml:14: cluster[0].cache.rule[0].in_transaction: unknown key `in_transaction`: did you mean `in_transactions`?",
        ),
        (
            &with("[cluster.cache]\n[[cluster.cache.rule]]\ntables = [\"a\"]\ncolour = 1"),
            "fulcrum.toml:14: cluster[0].cache.rule[0].colour: unknown key `colour`, expected one of `tables`, `ttl`, `in_transactions`",
        ),
    ]);
}

#[test]
fn the_wrong_brackets_are_reported() {
    assert_errors(&[(
        &with("[[cluster.cache]]\nmode = \"auto\""),
        "fulcrum.toml:11: cluster[0].cache[0]: invalid type: sequence, expected one table, starting with [cluster.cache] (single brackets)",
    )]);
    let got = super::error_of(&with(
        "[cluster.cache]\n[cluster.cache.rule]\ntables = [\"a\"]",
    ));
    assert!(
        got.contains("cluster[0].cache.rule") && got.contains("[[cluster.cache.rule]]"),
        "{got}"
    );
}

#[test]
fn the_commented_example_of_the_shipped_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/fulcrum.toml");
    let text = std::fs::read_to_string(path).expect("config/fulcrum.toml");
    let start = text
        .find("# [cluster.cache]")
        .expect("the commented example");
    // Uncomment the example's lines: headers and `key = value` lines.
    let uncommented: String = text[start..]
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if rest.starts_with('[') || rest.contains(" = ") => format!("{rest}\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    let whole = format!("{}{uncommented}", &text[..start]);
    let config = crate::parse(&whole, std::path::Path::new("fulcrum.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let cache = &config.clusters[0].cache;
    assert_eq!(cache.mode, CacheMode::Rules);
    assert_eq!(cache.rules[0].tables, vec!["pgbench_accounts".to_string()]);
    assert_eq!(cache.rules[0].ttl, Some(Duration::from_secs(30)));
}
