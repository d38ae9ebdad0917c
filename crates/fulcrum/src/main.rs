//! `fulcrum`: run the daemon (`fulcrum --config FILE`, default
//! `/etc/fulcrum/fulcrum.toml`), validate a config (`fulcrum check`: exit 0,
//! or print `file:line: key: reason` on stderr and exit 2), or print shell completions
//! (`fulcrum completions bash`) and the man page (`fulcrum manpage`),
//! generated from the definitions below.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use tokio::sync::watch;

#[derive(Parser)]
#[command(
    name = "fulcrum",
    version,
    about = "SQL-aware load-balancing proxy for PostgreSQL and MySQL"
)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, short = 'c', global = true, default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Where the config is read from when `--config` is not given.
const DEFAULT_CONFIG: &str = "/etc/fulcrum/fulcrum.toml";

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and exit: 0 (and `FILE: OK` on stdout) when valid, 2 with `file:line: key: reason` on stderr otherwise.
    Check {
        /// Also log in to every backend with each configured login (the
        /// health probe's and each user's server login) and report each
        /// backend's role or why the login failed; exit 1 if any failed.
        #[arg(long)]
        connect: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `fulcrum manpage > /usr/share/man/man1/fulcrum.1`.
    Manpage,
    /// Write a fulcrum.toml equivalent to another pooler's config.
    #[command(subcommand)]
    Import(Import),
}

#[derive(Subcommand)]
enum Import {
    /// From a PgBouncer ini (and its auth file): the TOML on stdout (or
    /// --output), what could not be carried over on stderr.
    Pgbouncer {
        /// pgbouncer.ini
        ini: PathBuf,
        /// The auth file with the users' passwords (default: the ini's auth_file).
        #[arg(long)]
        userlist: Option<PathBuf>,
        /// Write the TOML here instead of stdout.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    fulcrum::upgrade::remember_start();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Completions { shell }) => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "fulcrum",
                &mut std::io::stdout(),
            );
            return ExitCode::SUCCESS;
        }
        Some(Command::Import(Import::Pgbouncer {
            ref ini,
            ref userlist,
            ref output,
        })) => return import_pgbouncer(ini, userlist.as_deref(), output.as_deref()),
        Some(Command::Manpage) => {
            let page = clap_mangen::Man::new(Cli::command());
            return match page.render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fulcrum: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    let path = cli.config;
    let config = match fulcrum_config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            // On stderr, as every error: `fulcrum check > report` keeps
            // the OK line apart from the problems.
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Check { connect }) = cli.command {
        println!(
            "{}: OK ({} cluster(s))",
            path.display(),
            config.clusters.len()
        );
        if !connect {
            return ExitCode::SUCCESS;
        }
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("fulcrum: cannot start the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let lines = runtime.block_on(fulcrum::connect_check::check(&config));
        let mut failed = false;
        for line in &lines {
            if line.outcome.is_ok() {
                println!("{line}");
            } else {
                eprintln!("{line}");
                failed = true;
            }
        }
        return if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    // FULCRUM_LOG wins over the file's `log`; a bad one stops the start
    // (exit 2, as a bad `log` in the file does), never a silent `info`.
    let filter = match fulcrum::log_filter::from_env()
        .and_then(|env| fulcrum::log_filter::starting(&config.fulcrum.log, env.as_deref()))
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("fulcrum: {e}");
            return ExitCode::from(2);
        }
    };
    let set_log = init_logging(&filter, config.fulcrum.log_format);
    // Started by an upgrade: the config passed its check above; take the
    // old process's listening sockets (it stops its health loops first).
    match fulcrum::upgrade::successor::take_over() {
        None => {}
        Some(Ok(sockets)) => {
            tracing::info!(sockets, "upgrade: took the old process's listening sockets")
        }
        Some(Err(e)) => {
            tracing::error!("upgrade: {e}");
            eprintln!("fulcrum: upgrade: {e}");
            return ExitCode::FAILURE;
        }
    }
    fulcrum::descriptors::raise_for(&config);
    let runtime = match build_runtime(config.fulcrum.workers) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fulcrum: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let (tx, rx) = watch::channel(false);
        // Installed here, before the daemon tells systemd READY: a SIGTERM
        // right after it drains instead of ending the process at once.
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => {
                tokio::spawn(watch_signals(tx, term, int));
            }
            _ => tracing::error!("cannot install signal handlers"),
        }
        match fulcrum::run_logging(config, rx, set_log, filter).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("fulcrum: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// `fulcrum import pgbouncer`: exit 0 with the TOML written, 2 when the
/// files cannot be read or nothing could be made of them.
fn import_pgbouncer(
    ini: &std::path::Path,
    userlist: Option<&std::path::Path>,
    output: Option<&std::path::Path>,
) -> ExitCode {
    use fulcrum::import::{ini::userlist as read_userlist, ini::Ini, pgbouncer::import};
    let text = match std::fs::read_to_string(ini) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: cannot read: {e}", ini.display());
            return ExitCode::from(2);
        }
    };
    let parsed = Ini::parse(&text);
    let auth_file = userlist.map(std::path::Path::to_path_buf).or_else(|| {
        parsed
            .get("auth_file")
            .map(|f| ini.parent().unwrap_or(std::path::Path::new(".")).join(f))
    });
    let users = match &auth_file {
        Some(f) => match std::fs::read_to_string(f) {
            Ok(t) => read_userlist(&t),
            Err(e) => {
                eprintln!("{}: cannot read the auth file: {e}", f.display());
                return ExitCode::from(2);
            }
        },
        None => Vec::new(),
    };
    let imported = match import(&parsed, &users, &ini.display().to_string()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    for note in &imported.notes {
        eprintln!("not carried over: {note}");
    }
    match output {
        Some(path) => {
            if let Err(e) = write_private(path, &imported.toml) {
                eprintln!("{}: cannot write: {e}", path.display());
                return ExitCode::from(2);
            }
            eprintln!(
                "{}: written; check it with `fulcrum check --config {}`",
                path.display(),
                path.display()
            );
        }
        None => print!("{}", imported.toml),
    }
    ExitCode::SUCCESS
}

/// Writes `text` to `path` readable by its owner only (it holds the auth
/// file's passwords): a new file created with mode 0600 in the same
/// directory, then renamed over `path`, so the text is never in a file
/// others can read, even when `path` existed with a wider mode.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&temp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    let renamed = written.and_then(|()| std::fs::rename(&temp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    renamed
}

/// The control thread's runtime (listeners, health loop, console,
/// metrics). `workers = 1`: client sessions run on it too, one event loop
/// for everything. Otherwise `workers` threads (0 = one per CPU) each run
/// an event loop of their own, and each client's session runs on one of
/// them for life with the server connections that loop opened
/// (`fulcrum_cluster::workers`): no cross-thread wake-ups per unit.
fn build_runtime(workers: u32) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = match workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    if workers > 1 {
        fulcrum_cluster::workers::start(workers)?;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Installs the log subscriber with `filter` (valid: see
/// `log_filter::starting`); returns what `SET log = '...'` in the admin
/// console and a reload call to change it.
fn init_logging(filter: &str, format: fulcrum_config::LogFormat) -> fulcrum_admin::SetLog {
    use fulcrum::log_filter::parse;
    let env_filter = parse(filter).unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(fulcrum::log_filter::quiet_parser("info"))
    });
    match format {
        fulcrum_config::LogFormat::Text => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(env_filter)
                .with_target(false)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            builder.init();
            std::sync::Arc::new(move |f| handle.reload(parse(f)?).map_err(|e| e.to_string()))
        }
        // One JSON object per line, with the span fields (client, cluster).
        fulcrum_config::LogFormat::Json => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(env_filter)
                .with_target(false)
                .json()
                .with_current_span(true)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            builder.init();
            std::sync::Arc::new(move |f| handle.reload(parse(f)?).map_err(|e| e.to_string()))
        }
    }
}

/// SIGTERM stops accepting and lets clients finish their transactions (up to
/// `shutdown_timeout`); SIGINT stops at once. (SIGHUP reloads the config and
/// SIGUSR2 upgrades: the daemon's own handlers, in `fulcrum::run`.)
async fn watch_signals(
    tx: watch::Sender<bool>,
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
) {
    tokio::select! {
        _ = term.recv() => {
            tracing::info!("SIGTERM: no new clients; waiting for transactions in progress to finish");
        }
        _ = int.recv() => {
            tracing::info!("SIGINT: stopping now");
            // `exit` runs no destructors: the Unix sockets' files go first.
            fulcrum_net::listener::remove_socket_files();
            std::process::exit(0);
        }
    }
    let _ = tx.send(true);
}
