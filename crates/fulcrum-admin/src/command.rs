//! The console's commands, parsed from one simple-query text. Pure.

/// What `SHOW` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Pools,
    /// PgBouncer's: one row per server connection.
    Servers,
    /// Fulcrum's: one row per backend, its health and why it serves no reads.
    Backends,
    Clients,
    Stats,
    Clusters,
    Config,
    Version,
    Lists,
    /// One row per (cluster, database) with pools.
    Databases,
    /// The users of each cluster's config.
    Users,
    /// SHOW STATS summed over the clusters.
    Totals,
    /// What the process holds in memory.
    Mem,
    /// Fulcrum's pools one by one (per backend), with their budgets.
    ServerPools,
    /// The commands, one per row.
    Help,
    /// The changes of primary this instance saw, with their times.
    Failovers,
    Listeners,
    Mirror,
    Cache,
    /// The upgrades this process took part in.
    Upgrade,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Show(Show),
    /// Hold new units of work (one cluster, or all).
    Pause(Option<String>),
    Resume(Option<String>),
    /// Take a backend (by address, or `cluster/address`) out of reads
    /// (`DISABLE BACKEND x`, or `DISABLE x` when x is an address).
    Disable(String),
    Enable(String),
    /// PgBouncer's `DISABLE db`: refuse new logins to a database.
    DisableDatabase(String),
    EnableDatabase(String),
    Reload,
    /// Start the binary at the daemon's path and hand it the listeners.
    Upgrade,
    /// Drain and stop the daemon, as SIGTERM does.
    Shutdown,
    Switchover {
        cluster: String,
        backend: String,
    },
    SetLog(String),
    /// Drop every client and server connection of a database.
    Kill(String),
    /// Close every server connection (of a database) once it is idle.
    Reconnect(Option<String>),
    /// Wait until the connections a RECONNECT closes are gone.
    WaitClose(Option<String>),
    /// Statement digests by total time (`SHOW QUERIES [cluster]`).
    ShowQueries(Option<String>),
    /// `SHOW QUERIES RESET [cluster]`: forget the digests.
    ResetQueries(Option<String>),
    /// `FLUSH CACHE [table]`: drop every result-cache entry, or those of
    /// the tables of that name, in every cluster.
    FlushCache(Option<String>),
}

impl Command {
    /// Whether the command only reads (what a `stats_users` login may run):
    /// the SHOW commands, but not `SHOW QUERIES RESET`.
    pub fn only_reads(&self) -> bool {
        matches!(self, Command::Show(_) | Command::ShowQueries(_))
    }
}

/// What `SHOW` takes, as the hints name it (every one parses: the test
/// `every_named_show_target_parses`).
const SHOW_TARGETS: &str = "HELP, POOLS, SERVER_POOLS, SERVERS, BACKENDS, CLIENTS, STATS, TOTALS, QUERIES, MEM, CLUSTERS, DATABASES, USERS, CONFIG, VERSION, LISTS, FAILOVERS, LISTENERS, MIRROR, CACHE, UPGRADE";

/// The console's commands, as the unknown-command hint names them.
const COMMANDS: &str = "SHOW HELP, SHOW, PAUSE, RESUME, DISABLE, ENABLE, FLUSH CACHE, RELOAD, UPGRADE, RECONNECT, WAIT_CLOSE, KILL, SWITCHOVER, SHUTDOWN, SET log = '...'";

/// Parses one command; the error says what is wrong, for the client.
pub fn parse(text: &str) -> Result<Command, String> {
    let text = text.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = text.split_whitespace().collect();
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    let u: Vec<&str> = upper.iter().map(String::as_str).collect();
    let one_arg = |what: &str| -> Result<String, String> {
        match words.get(1..) {
            Some([arg]) => Ok((*arg).to_owned()),
            _ => Err(format!(
                "{what} takes one argument: {what} <backend address>"
            )),
        }
    };
    match u.as_slice() {
        ["SHOW", "QUERIES"] => Ok(Command::ShowQueries(None)),
        ["SHOW", "QUERIES", "RESET"] => Ok(Command::ResetQueries(None)),
        ["SHOW", "QUERIES", "RESET", _] => Ok(Command::ResetQueries(Some(words[3].to_owned()))),
        ["SHOW", "QUERIES", _] => Ok(Command::ShowQueries(Some(words[2].to_owned()))),
        ["SHOW", what] => Ok(Command::Show(match *what {
            "POOLS" => Show::Pools,
            "SERVERS" => Show::Servers,
            "BACKENDS" => Show::Backends,
            "CLIENTS" => Show::Clients,
            "STATS" => Show::Stats,
            "CLUSTERS" => Show::Clusters,
            "CONFIG" => Show::Config,
            "VERSION" => Show::Version,
            "LISTS" => Show::Lists,
            "DATABASES" => Show::Databases,
            "USERS" => Show::Users,
            "TOTALS" => Show::Totals,
            "MEM" => Show::Mem,
            "SERVER_POOLS" => Show::ServerPools,
            "HELP" => Show::Help,
            "FAILOVERS" => Show::Failovers,
            "LISTENERS" => Show::Listeners,
            "MIRROR" => Show::Mirror,
            "CACHE" => Show::Cache,
            "UPGRADE" => Show::Upgrade,
            other => return Err(format!("unknown SHOW {other}; try {SHOW_TARGETS}")),
        })),
        ["SHOW"] => Err(format!("SHOW what? {SHOW_TARGETS}")),
        ["PAUSE"] => Ok(Command::Pause(None)),
        ["PAUSE", _] => Ok(Command::Pause(Some(words[1].to_owned()))),
        ["RESUME"] => Ok(Command::Resume(None)),
        ["RESUME", _] => Ok(Command::Resume(Some(words[1].to_owned()))),
        ["DISABLE", "BACKEND", _] => Ok(Command::Disable(words[2].to_owned())),
        ["ENABLE", "BACKEND", _] => Ok(Command::Enable(words[2].to_owned())),
        // PgBouncer's meaning for a name; a backend address keeps the
        // backend meaning (an address has a ':').
        ["DISABLE", _] if !words[1].contains(':') => {
            Ok(Command::DisableDatabase(words[1].to_owned()))
        }
        ["ENABLE", _] if !words[1].contains(':') => {
            Ok(Command::EnableDatabase(words[1].to_owned()))
        }
        ["DISABLE", ..] => one_arg("DISABLE").map(Command::Disable),
        ["ENABLE", ..] => one_arg("ENABLE").map(Command::Enable),
        ["FLUSH", "CACHE"] => Ok(Command::FlushCache(None)),
        ["FLUSH", "CACHE", _] => Ok(Command::FlushCache(Some(words[2].to_owned()))),
        ["FLUSH", ..] => Err("usage: FLUSH CACHE [table]".into()),
        ["RELOAD"] => Ok(Command::Reload),
        ["UPGRADE"] => Ok(Command::Upgrade),
        ["SHUTDOWN"] => Ok(Command::Shutdown),
        ["KILL", _] => Ok(Command::Kill(words[1].to_owned())),
        ["KILL", ..] => Err("usage: KILL <database>".into()),
        ["RECONNECT"] => Ok(Command::Reconnect(None)),
        ["RECONNECT", _] => Ok(Command::Reconnect(Some(words[1].to_owned()))),
        ["WAIT_CLOSE"] => Ok(Command::WaitClose(None)),
        ["WAIT_CLOSE", _] => Ok(Command::WaitClose(Some(words[1].to_owned()))),
        ["SWITCHOVER", _, "TO", _] => Ok(Command::Switchover {
            cluster: words[1].to_owned(),
            backend: words[3].to_owned(),
        }),
        ["SWITCHOVER", ..] => Err("usage: SWITCHOVER <cluster> TO <backend address>".into()),
        ["SET", ..] => parse_set(text),
        [] => Err("empty command".into()),
        _ => Err(format!("unknown command {:?}; try {COMMANDS}", words[0])),
    }
}

/// `SET log = 'filter'` or `SET log TO 'filter'`.
fn parse_set(text: &str) -> Result<Command, String> {
    let rest = text[3..].trim_start();
    let Some(after) = rest
        .strip_prefix("log")
        .or_else(|| rest.strip_prefix("LOG"))
        .map(str::trim_start)
    else {
        return Err("only SET log = '<filter>' can be set here".into());
    };
    let value = after
        .strip_prefix('=')
        .or_else(|| after.strip_prefix("TO"))
        .or_else(|| after.strip_prefix("to"))
        .map(str::trim)
        .ok_or("usage: SET log = '<filter>', e.g. SET log = 'debug'")?;
    let value = value.trim_matches('\'').trim_matches('"');
    if value.is_empty() {
        return Err("SET log needs a filter such as 'info' or 'fulcrum=debug'".into());
    }
    Ok(Command::SetLog(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_case_insensitively() {
        assert_eq!(parse("show pools;"), Ok(Command::Show(Show::Pools)));
        assert_eq!(parse("SHOW CLUSTERS"), Ok(Command::Show(Show::Clusters)));
        assert_eq!(parse("show queries"), Ok(Command::ShowQueries(None)));
        assert_eq!(
            parse("SHOW QUERIES main;"),
            Ok(Command::ShowQueries(Some("main".into())))
        );
        assert_eq!(parse("SHOW QUERIES RESET"), Ok(Command::ResetQueries(None)));
        assert_eq!(parse("show mem"), Ok(Command::Show(Show::Mem)));
        assert_eq!(parse("KILL app;"), Ok(Command::Kill("app".into())));
        assert_eq!(parse("flush cache"), Ok(Command::FlushCache(None)));
        assert_eq!(
            parse("FLUSH CACHE public.t;"),
            Ok(Command::FlushCache(Some("public.t".into())))
        );
        assert_eq!(parse("SHOW CACHE"), Ok(Command::Show(Show::Cache)));
        assert_eq!(parse("show upgrade"), Ok(Command::Show(Show::Upgrade)));
        assert!(parse("FLUSH").is_err());
        assert!(parse("KILL").is_err());
        assert_eq!(parse("reconnect"), Ok(Command::Reconnect(None)));
        assert_eq!(
            parse("RECONNECT app"),
            Ok(Command::Reconnect(Some("app".into())))
        );
        assert_eq!(
            parse("wait_close app"),
            Ok(Command::WaitClose(Some("app".into())))
        );
        assert_eq!(
            parse("show queries reset shop"),
            Ok(Command::ResetQueries(Some("shop".into())))
        );
        assert_eq!(parse("pause"), Ok(Command::Pause(None)));
        assert_eq!(parse("PAUSE main"), Ok(Command::Pause(Some("main".into()))));
        assert_eq!(
            parse("resume main"),
            Ok(Command::Resume(Some("main".into())))
        );
        assert_eq!(
            parse("DISABLE 127.0.0.1:5433"),
            Ok(Command::Disable("127.0.0.1:5433".into()))
        );
        assert_eq!(
            parse("enable main/127.0.0.1:5433"),
            Ok(Command::Enable("main/127.0.0.1:5433".into()))
        );
        assert_eq!(parse("RELOAD"), Ok(Command::Reload));
        assert_eq!(parse("upgrade"), Ok(Command::Upgrade));
        assert_eq!(parse("SHUTDOWN"), Ok(Command::Shutdown));
        assert_eq!(parse("SHOW HELP"), Ok(Command::Show(Show::Help)));
        assert_eq!(parse("show servers"), Ok(Command::Show(Show::Servers)));
        assert_eq!(parse("SHOW BACKENDS"), Ok(Command::Show(Show::Backends)));
        assert_eq!(
            parse("DISABLE app"),
            Ok(Command::DisableDatabase("app".into()))
        );
        assert_eq!(
            parse("ENABLE app"),
            Ok(Command::EnableDatabase("app".into()))
        );
        assert_eq!(
            parse("DISABLE 10.0.0.1:5432"),
            Ok(Command::Disable("10.0.0.1:5432".into()))
        );
        assert_eq!(
            parse("DISABLE BACKEND db1"),
            Ok(Command::Disable("db1".into()))
        );
        assert_eq!(
            parse("ENABLE BACKEND db1"),
            Ok(Command::Enable("db1".into()))
        );
        assert_eq!(
            parse("SWITCHOVER main TO 127.0.0.1:5433"),
            Ok(Command::Switchover {
                cluster: "main".into(),
                backend: "127.0.0.1:5433".into()
            })
        );
        assert_eq!(
            parse("SET log = 'debug'"),
            Ok(Command::SetLog("debug".into()))
        );
        assert_eq!(
            parse("set log to 'fulcrum=debug,info'"),
            Ok(Command::SetLog("fulcrum=debug,info".into()))
        );
    }

    #[test]
    fn bad_commands_say_what_is_wrong() {
        assert!(parse("SHOW TABLES").unwrap_err().contains("unknown SHOW"));
        assert!(parse("SHOW").is_err());
        assert!(parse("DISABLE").unwrap_err().contains("one argument"));
        assert!(parse("DISABLE a b").is_err());
        assert!(parse("SWITCHOVER main").unwrap_err().contains("usage"));
        assert!(parse("SET work_mem = 1")
            .unwrap_err()
            .contains("only SET log"));
        assert!(parse("SET log = ''").is_err());
        assert!(parse("DROP TABLE x")
            .unwrap_err()
            .contains("unknown command"));
        assert!(parse("").is_err());
        assert!(parse("DROP TABLE x").unwrap_err().contains("FLUSH CACHE"));
    }

    /// The hints name only what parses, and every `SHOW` target.
    #[test]
    fn every_named_show_target_parses() {
        for what in SHOW_TARGETS.split(", ") {
            assert!(parse(&format!("SHOW {what}")).is_ok(), "SHOW {what}");
        }
        for what in ["SERVER_POOLS", "FAILOVERS", "MIRROR", "CACHE", "UPGRADE"] {
            assert!(parse("SHOW").unwrap_err().contains(what), "{what}");
        }
    }
}
