//! Validates `[cluster.cache]` and its `[[cluster.cache.rule]]`s: `mode`,
//! `isolation` and `invalidation` among their words, `max_memory`,
//! `max_result` and `ttl` above zero with `max_result` within `max_memory`,
//! each rule's `tables` (`table` or `schema.table`, stored lower case) and
//! `ttl` (not above the cluster's). Every key is read even when
//! `mode = "off"`, so a typo is caught before the cache is turned on.

use std::time::Duration;

use toml::Spanned;

use super::table::Table;
use crate::error::Problem;
use crate::raw::{RawCacheRule, RawCluster, Value};
use crate::types::{Cache, CacheInvalidation, CacheIsolation, CacheMode, CacheRule};

/// The cluster's cache: [`Cache::default`] (off) without `[cluster.cache]`.
pub(super) fn cache(t: &Table, c: &RawCluster) -> Result<Cache, Problem> {
    let Some(raw) = &c.cache else {
        return Ok(Cache::default());
    };
    let ct = t.child("cache", raw.span());
    let r = &raw.get_ref().0;
    let defaults = Cache::default();
    let mode = ct.choice(&r.mode, "mode", CacheMode::NAMES, Some(defaults.mode))?;
    let max_memory = ct.size(&r.max_memory, "max_memory", defaults.max_memory)?;
    let max_result = ct.size(&r.max_result, "max_result", defaults.max_result)?;
    if max_result > max_memory {
        return Err(match (&r.max_memory, &r.max_result) {
            (Some(v), _) => ct.error(
                v,
                "max_memory",
                format!("must be at least max_result ({max_result} bytes)"),
            ),
            (None, Some(v)) => ct.error(
                v,
                "max_result",
                format!("must not exceed max_memory ({max_memory} bytes, the default)"),
            ),
            (None, None) => unreachable!("the defaults fit"),
        });
    }
    let ttl = ct.duration(&r.ttl, "ttl", defaults.ttl)?;
    let ttl_words = written(&r.ttl, ttl);
    let isolation = ct.choice(
        &r.isolation,
        "isolation",
        CacheIsolation::NAMES,
        Some(defaults.isolation),
    )?;
    let invalidation = ct.choice(
        &r.invalidation,
        "invalidation",
        CacheInvalidation::NAMES,
        Some(defaults.invalidation),
    )?;
    let items = r
        .rule
        .as_ref()
        .map_or(&[][..], |v| v.get_ref().0.as_slice());
    let mut rules = Vec::with_capacity(items.len());
    for (j, item) in items.iter().enumerate() {
        let rt = ct.child(&format!("rule[{j}]"), item.span());
        rules.push(rule(&rt, item.get_ref(), ttl, &ttl_words)?);
    }
    if mode == CacheMode::Rules && rules.is_empty() {
        let v = r.mode.as_ref().expect("rules is never the default");
        return Err(ct.error(
            v,
            "mode",
            "mode = \"rules\" caches nothing without a [[cluster.cache.rule]]",
        ));
    }
    Ok(Cache {
        mode,
        max_memory,
        ttl,
        max_result,
        isolation,
        invalidation,
        rules,
    })
}

/// One `[[cluster.cache.rule]]`; `ttl` is the cluster's, `ttl_words` it as
/// written (or its default).
fn rule(
    rt: &Table,
    r: &RawCacheRule,
    ttl: Duration,
    ttl_words: &str,
) -> Result<CacheRule, Problem> {
    let list = rt.required(&r.tables, "tables")?;
    if list.get_ref().is_empty() {
        return Err(rt.error(
            list,
            "tables",
            "must list at least one table (`table` or `schema.table`)",
        ));
    }
    let tables = list
        .get_ref()
        .iter()
        .map(|name| table_name(rt, name))
        .collect::<Result<Vec<_>, _>>()?;
    let rule_ttl = match &r.ttl {
        None => None,
        Some(v) => {
            let d = rt.duration(&r.ttl, "ttl", Duration::ZERO)?;
            if d > ttl {
                return Err(rt.error(
                    v,
                    "ttl",
                    format!(
                        "{:?} is above [cluster.cache] ttl {ttl_words}: a rule's ttl may only shorten the cluster's",
                        v.get_ref().0
                    ),
                ));
            }
            Some(d)
        }
    };
    Ok(CacheRule {
        tables,
        ttl: rule_ttl,
        in_transactions: r.in_transactions.as_ref().is_some_and(|v| *v.get_ref()),
    })
}

/// `table` or `schema.table`, lower case.
fn table_name(rt: &Table, name: &Spanned<String>) -> Result<String, Problem> {
    let text = name.get_ref();
    let ok = !text.is_empty()
        && text.split('.').count() <= 2
        && text
            .split('.')
            .all(|part| !part.is_empty() && !part.chars().any(char::is_whitespace));
    if !ok {
        return Err(rt.error(
            name,
            "tables",
            format!("{text:?} is not a table name (`table` or `schema.table`, no spaces)"),
        ));
    }
    Ok(text.to_lowercase())
}

/// `= "60s"` as the file wrote a duration, or `(60s, the default)`.
fn written(raw: &Value<crate::raw::DurationText>, value: Duration) -> String {
    raw.as_ref().map_or_else(
        || format!("({value:?}, the default)"),
        |v| format!("= {:?}", v.get_ref().0),
    )
}
