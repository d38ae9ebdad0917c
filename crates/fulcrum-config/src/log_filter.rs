//! What a log filter (`log`, `FULCRUM_LOG`, the console's `SET log`) must
//! be: `RUST_LOG` syntax that the daemon's subscriber parses, where a bare
//! word is a level or a target Fulcrum logs under (the parser takes any
//! bare word as a target, so a misspelt level such as `degub` would
//! otherwise pass and log nothing it meant to). Pure.

/// `Ok` when `text` is a filter the daemon can run; else why not.
pub fn check(text: &str) -> Result<(), String> {
    const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];
    const TARGETS: &[&str] = &[
        "fulcrum",
        "sqlparser",
        "tokio",
        "hyper",
        "rustls",
        "h2",
        "mysql",
    ];
    for d in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if d.contains('=') || d.contains('[') {
            continue;
        }
        let known = LEVELS.iter().any(|l| d.eq_ignore_ascii_case(l))
            || TARGETS.iter().any(|p| d.starts_with(p));
        if !known {
            return Err(format!("{d:?} is neither a level (trace, debug, info, warn, error, off) nor a target Fulcrum logs under (fulcrum..., sqlparser, ...)"));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(text)
        .map(|_| ())
        .map_err(|e| {
            format!("not a log filter ({e}); e.g. \"info\" or \"fulcrum_cluster=debug,info\"")
        })
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn levels_targets_and_directives_pass_and_typos_do_not() {
        for ok in [
            "info",
            "debug,sqlparser=warn",
            "fulcrum_cluster=debug,info",
            "WARN",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        assert!(check("degub")
            .unwrap_err()
            .contains("\"degub\" is neither a level"));
        assert!(check("fulcrum=loud")
            .unwrap_err()
            .starts_with("not a log filter"));
    }
}
