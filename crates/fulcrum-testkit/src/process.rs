//! Finding and running external programs: the PostgreSQL binaries (run as the
//! `postgres` user through `runuser` when we are root, because PostgreSQL
//! refuses to run as root), the MariaDB binaries (run as whoever we are, with
//! `--no-defaults` so the machine's `/etc/mysql` never applies), plus a runner
//! that turns a failed exit into a [`TestkitError::CommandFailed`] naming the
//! command, its target and stderr.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::error::{tail, Result, TestkitError};

/// libpq/PostgreSQL variables that would silently redirect our commands.
const PG_ENV_VARS: &[&str] = &[
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGOPTIONS",
    "PGDATA",
    "PGTARGETSESSIONATTRS",
];

/// Client variables that would silently redirect the MariaDB client (it reads
/// them even with `--no-defaults`).
const MARIA_ENV_VARS: &[&str] = &[
    "MYSQL_HOST",
    "MYSQL_TCP_PORT",
    "MYSQL_UNIX_PORT",
    "MYSQL_PWD",
    "MYSQL_HISTFILE",
    "MYSQL_PS1",
    "MYSQL_TEST_LOGIN_FILE",
    "MARIADB_HOST",
];

/// Where MariaDB binaries live on Debian (`mariadbd` is in sbin, which is not
/// on every user's `$PATH`), searched before `$PATH`.
const MARIA_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"];

/// Where a PostgreSQL client or server binary lives.
///
/// Looks in `/usr/lib/postgresql/15/bin` first (the version the suite targets),
/// then the newest `/usr/lib/postgresql/*/bin`, then `$PATH`. Falls back to the
/// bare name so the eventual spawn error names the missing program.
pub fn pg_bin(name: &str) -> PathBuf {
    find_pg_bin(name).unwrap_or_else(|_| PathBuf::from(name))
}

/// Like [`pg_bin`], but an error listing where it looked when nothing is found.
pub fn find_pg_bin(name: &str) -> Result<PathBuf> {
    let mut searched = Vec::new();
    let preferred = Path::new("/usr/lib/postgresql/15/bin").join(name);
    if preferred.is_file() {
        return Ok(preferred);
    }
    searched.push("/usr/lib/postgresql/15/bin".to_string());

    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versions.sort_by_key(|v| std::cmp::Reverse(v.0));
    for (_, dir) in versions {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
        searched.push(dir.display().to_string());
    }

    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    searched.push("$PATH".to_string());
    Err(TestkitError::BinaryNotFound {
        name: name.to_string(),
        searched: searched.join(", "),
        hint: "install PostgreSQL 15 (Debian: apt-get install postgresql-15)".to_string(),
    })
}

/// Where a MariaDB binary (`mariadbd`, `mariadb-install-db`, `mariadb`, ...)
/// lives: `/usr/sbin`, `/usr/bin`, `/usr/local/{sbin,bin}`, then `$PATH`.
/// Falls back to the bare name so the eventual spawn error names the program.
pub fn maria_bin(name: &str) -> PathBuf {
    find_maria_bin(name).unwrap_or_else(|_| PathBuf::from(name))
}

/// Like [`maria_bin`], but an error listing where it looked when nothing is found.
pub fn find_maria_bin(name: &str) -> Result<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let dirs = MARIA_DIRS.iter().map(PathBuf::from).chain(path_dirs);
    for dir in dirs {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(TestkitError::BinaryNotFound {
        name: name.to_string(),
        searched: format!("{}, $PATH", MARIA_DIRS.join(", ")),
        hint: "install MariaDB (Debian: apt-get install mariadb-server mariadb-client)".to_string(),
    })
}

/// True when this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Raises this process's soft RLIMIT_NOFILE to its hard limit: thousands of
/// clients (and the servers and daemons it starts, which inherit the limit)
/// need more descriptors than the usual 1,024.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid struct pointer.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// uid and gid of the `postgres` account (only needed when running as root).
pub(crate) fn postgres_ids() -> Result<(u32, u32)> {
    static IDS: OnceLock<Result<(u32, u32), String>> = OnceLock::new();
    let ids = IDS.get_or_init(|| {
        let id = |flag: &str| -> Result<u32, String> {
            let out = Command::new("id")
                .args([flag, "postgres"])
                .output()
                .map_err(|e| format!("running `id {flag} postgres`: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "`id {flag} postgres` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .map_err(|e| format!("`id {flag} postgres` printed a non-number: {e}"))
        };
        Ok((id("-u")?, id("-g")?))
    });
    ids.clone().map_err(|reason| {
        TestkitError::Invalid(format!(
            "running as root needs a `postgres` user to own the servers: {reason}"
        ))
    })
}

/// A command for a PostgreSQL server-side binary (`initdb`, `pg_ctl`, ...):
/// run through `runuser -u postgres --` when we are root, directly otherwise.
/// The working directory is set to `cwd`, which must be readable by postgres.
pub(crate) fn server_command(name: &str, cwd: &Path) -> Command {
    let bin = pg_bin(name);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.current_dir(cwd);
    scrub_env(&mut cmd);
    cmd
}

/// A command for a PostgreSQL client binary (`psql`, `pgbench`), run as the
/// current user: clients have no objection to root.
pub(crate) fn client_command(name: &str) -> Command {
    let mut cmd = Command::new(pg_bin(name));
    scrub_env(&mut cmd);
    cmd
}

/// A command for a MariaDB binary (server, installer or client), run as the
/// current user, with `--no-defaults` as its first argument (every MariaDB
/// program requires it first): neither `/etc/mysql/my.cnf`, which points at
/// the machine's own server, nor `~/.my.cnf` may apply.
pub(crate) fn maria_command(name: &str) -> Command {
    let mut cmd = Command::new(maria_bin(name));
    cmd.arg("--no-defaults");
    for var in MARIA_ENV_VARS {
        cmd.env_remove(var);
    }
    cmd.env("LC_MESSAGES", "C");
    cmd
}

fn scrub_env(cmd: &mut Command) {
    for var in PG_ENV_VARS {
        cmd.env_remove(var);
    }
    // Deterministic messages to parse, whatever the caller's locale.
    cmd.env("LC_MESSAGES", "C");
}

/// `program arg1 arg2 ...` for messages (no env noise, unlike `{:?}`).
pub(crate) fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a: &OsStr| {
        let a = a.to_string_lossy();
        if a.contains(char::is_whitespace) || a.is_empty() {
            format!("'{a}'")
        } else {
            a.into_owned()
        }
    }));
    parts.join(" ")
}

/// Runs `cmd` to completion (stdin optional) and returns its output, or a
/// `CommandFailed` error naming `target` if it exits unsuccessfully.
pub(crate) fn run(cmd: &mut Command, stdin: Option<&str>, target: &str) -> Result<Output> {
    let out = output(cmd, stdin)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(failed(cmd, &out, target))
    }
}

/// Runs `cmd` to completion and returns its output whatever the exit status.
pub(crate) fn output(cmd: &mut Command, stdin: Option<&str>) -> Result<Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .map_err(|e| TestkitError::io(format!("spawning `{}`", describe(cmd)), e))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin was piped");
        // A write error means the child exited early; its status says why.
        let _ = pipe.write_all(input.as_bytes());
    }
    child
        .wait_with_output()
        .map_err(|e| TestkitError::io(format!("waiting for `{}`", describe(cmd)), e))
}

/// The error for a command that ran and failed.
pub(crate) fn failed(cmd: &Command, out: &Output, target: &str) -> TestkitError {
    let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if stderr.trim().is_empty() {
        stderr = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    TestkitError::CommandFailed {
        target: target.to_string(),
        command: describe(cmd),
        status: out.status.to_string(),
        stderr_tail: tail(&stderr, 20),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_bin_finds_the_postgresql_15_tools() {
        for name in ["initdb", "pg_ctl", "psql", "pgbench", "pg_basebackup"] {
            let path = pg_bin(name);
            assert!(path.is_file(), "{name} -> {}", path.display());
        }
    }

    #[test]
    fn maria_bin_finds_the_mariadb_tools() {
        for name in ["mariadbd", "mariadb-install-db", "mariadb"] {
            let path = maria_bin(name);
            assert!(path.is_file(), "{name} -> {}", path.display());
        }
        let err = find_maria_bin("no-such-maria-tool")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/usr/sbin") && err.contains("$PATH"), "{err}");
    }

    #[test]
    fn maria_commands_ignore_option_files() {
        let cmd = maria_command("mariadb");
        assert_eq!(
            cmd.get_args().next().and_then(|a| a.to_str()),
            Some("--no-defaults")
        );
    }

    #[test]
    fn missing_binary_error_names_where_it_looked() {
        let err = find_pg_bin("no-such-pg-tool").unwrap_err().to_string();
        assert!(
            err.contains("no-such-pg-tool") && err.contains("$PATH"),
            "{err}"
        );
    }

    #[test]
    fn failed_command_error_carries_stderr() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom >&2; exit 3"]);
        let err = run(&mut cmd, None, "test target").unwrap_err().to_string();
        assert!(err.contains("test target") && err.contains("boom"), "{err}");
    }
}
