//! The log filter as Fulcrum applies it: sqlparser logs whole statements at
//! debug level (with any password or personal data in them), so its target
//! stays at `warn` unless the filter names it (`log = "debug,sqlparser=debug"`).

/// `filter` with `sqlparser=warn` added when it does not name sqlparser.
pub fn quiet_parser(filter: &str) -> String {
    if filter.contains("sqlparser") {
        filter.to_owned()
    } else if filter.trim().is_empty() {
        "sqlparser=warn".to_owned()
    } else {
        format!("{filter},sqlparser=warn")
    }
}

#[cfg(test)]
mod tests {
    use super::quiet_parser;

    #[test]
    fn sqlparser_stays_at_warn_unless_named() {
        assert_eq!(quiet_parser("debug"), "debug,sqlparser=warn");
        assert_eq!(
            quiet_parser("fulcrum=trace,info"),
            "fulcrum=trace,info,sqlparser=warn"
        );
        assert_eq!(
            quiet_parser("debug,sqlparser=debug"),
            "debug,sqlparser=debug"
        );
        assert_eq!(quiet_parser(""), "sqlparser=warn");
    }
}
