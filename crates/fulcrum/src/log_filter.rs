//! The log filter as Fulcrum applies it: where it comes from at start
//! (`FULCRUM_LOG` wins over the file's `log`), how a filter is parsed
//! (sqlparser logs whole statements at debug level, with any password or
//! personal data in them, so its target stays at `warn` unless the filter
//! names it: `log = "debug,sqlparser=debug"`), and where the filter
//! running now is kept: the console's config, which SHOW CONFIG reads.

use std::sync::{Arc, Mutex};

use tracing_subscriber::EnvFilter;

/// The environment variable that replaces `[fulcrum] log`, at start and
/// on reload.
pub const ENV: &str = "FULCRUM_LOG";

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

/// `filter` as the subscriber takes it (start, `SET log`, a reload).
pub fn parse(filter: &str) -> Result<EnvFilter, String> {
    fulcrum_config::log_filter::check(filter)
        .and_then(|()| EnvFilter::try_new(quiet_parser(filter)).map_err(|e| e.to_string()))
        .map_err(|e| format!("invalid log filter {filter:?}: {e}"))
}

/// `FULCRUM_LOG`'s value when it is set and not empty (`Environment=FULCRUM_LOG=`
/// in a unit file clears it); an error when it is not valid Unicode.
pub fn from_env() -> Result<Option<String>, String> {
    from(std::env::var(ENV))
}

fn from(var: Result<String, std::env::VarError>) -> Result<Option<String>, String> {
    match var {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "{ENV}={v:?} is not a log filter: not valid Unicode"
        )),
    }
}

/// The filter the daemon starts with: `env` (`FULCRUM_LOG`) when set, else
/// the file's `log` (already validated with the config). An invalid
/// `FULCRUM_LOG` is an error naming the variable and its value, as an
/// invalid `log` in the file is: never a silent fallback to `info`.
pub fn starting(file: &str, env: Option<&str>) -> Result<String, String> {
    let Some(env) = env else {
        return Ok(file.to_owned());
    };
    fulcrum_config::log_filter::check(env)
        .and_then(|()| EnvFilter::try_new(quiet_parser(env)).map_err(|e| e.to_string()))
        .map(|_| env.to_owned())
        .map_err(|e| {
            format!(
                "{ENV}={env:?} is not a log filter ({e}); e.g. {ENV}=debug or {ENV}=fulcrum_cluster=debug,info"
            )
        })
}

/// `apply` (what changes the subscriber's filter), which also writes each
/// filter it applied into `shown`, the console's config: the one place the
/// running filter is kept, so SHOW CONFIG's `fulcrum.log` is the filter in
/// effect after `SET log`, a reload or with `FULCRUM_LOG`.
pub fn recording(
    apply: fulcrum_admin::SetLog,
    shown: Arc<Mutex<fulcrum_config::Config>>,
) -> fulcrum_admin::SetLog {
    Arc::new(move |filter: &str| {
        apply(filter)?;
        shown.lock().unwrap_or_else(|e| e.into_inner()).fulcrum.log = filter.to_owned();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn fulcrum_log_wins_and_a_bad_one_is_an_error_naming_it() {
        assert_eq!(starting("info", None).unwrap(), "info");
        assert_eq!(starting("info", Some("debug")).unwrap(), "debug");
        let e = starting("info", Some("info,fulcrum=loud")).unwrap_err();
        assert!(
            e.starts_with("FULCRUM_LOG=\"info,fulcrum=loud\" is not a log filter ("),
            "{e}"
        );
        // A misspelt level is refused as the file's `log` is, there and
        // for SET log / a reload (`parse`).
        assert!(starting("info", Some("degub"))
            .unwrap_err()
            .contains("\"degub\" is neither a level"));
        assert!(parse("degub").is_err() && parse("fulcrum=debug,info").is_ok());
        assert_eq!(from(Ok("  ".into())).unwrap(), None, "empty is unset");
        assert_eq!(from(Err(std::env::VarError::NotPresent)).unwrap(), None);
    }
}
