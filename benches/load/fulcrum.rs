//! The daemon under test: building it ([`ensure_fulcrum_built`]), its
//! config (`[fulcrum]` with the `[[cluster]]` sections in front of the
//! PostgreSQL servers), and checking it is still running ([`fulcrum_alive`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use fulcrum_testkit::{
    fulcrum_bin, FulcrumProcess, PgCluster, APP_PASSWORD, APP_USER, FULCRUM_BIN_ENV,
};

use crate::process::tail;
use crate::{target_dir, Result, POOL_SIZE};

/// Builds the release daemon, which `cargo bench` does not (the root package
/// does not depend on it), so every run measures the current source.
pub(crate) fn ensure_fulcrum_built() -> Result<PathBuf> {
    if std::env::var_os(FULCRUM_BIN_ENV).is_none() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        eprintln!("building the daemon: cargo build --release -p fulcrum");
        let status = Command::new(&cargo)
            .args(["build", "--release", "-p", "fulcrum"])
            // Where this bench was built, so the daemon lands next to it
            // (`fulcrum_bin()` looks in this profile's directory).
            .env("CARGO_TARGET_DIR", target_dir())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("running cargo build: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`cargo build --release -p fulcrum` failed ({status}); fix the build, or \
                 run: cargo build --release -p fulcrum and set {FULCRUM_BIN_ENV}=target/release/fulcrum"
            )
            .into());
        }
    }
    let bin = fulcrum_bin();
    if !bin.is_file() {
        return Err(format!(
            "no daemon binary at {}; run: cargo build --release -p fulcrum",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// The daemon's config: `[fulcrum]` and the given `[[cluster]]` sections.
pub(crate) fn fulcrum_config(workers: u32, clusters: &[String]) -> String {
    format!(
        "[fulcrum]\nlog = \"info\"\nworkers = {workers}\n\n{}",
        clusters.join("\n")
    )
}

/// One `[[cluster]]` listening on `listen`, in front of the primary and every
/// replica of `pg`; `consistency` is left at its default when `None`.
pub(crate) fn cluster_section(
    name: &str,
    listen: &str,
    consistency: Option<&str>,
    pg: &PgCluster,
) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"postgres\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\nclient_auth = \"scram-sha-256\"\n"
    );
    if let Some(consistency) = consistency {
        let _ = writeln!(out, "consistency = \"{consistency}\"");
    }
    let replicas: Vec<String> = pg.replicas().iter().map(|r| r.addr()).collect();
    push_backends_and_user(&mut out, &pg.primary().addr(), &replicas);
    out
}

/// `--scale-out`: a `[[cluster]]` on `listen` in front of `primary` and
/// `replicas`, `consistency = "eventual"`, reads spread over all of them
/// (with no replica, the primary serves the reads anyway).
pub(crate) fn scale_out_section(
    name: &str,
    listen: &str,
    primary: &str,
    replicas: &[String],
) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"postgres\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\nclient_auth = \"scram-sha-256\"\n\
         consistency = \"eventual\"\nreads_on_primary = true\n"
    );
    push_backends_and_user(&mut out, primary, replicas);
    out
}

/// The end of every `[[cluster]]` section here: `primary` and `replicas` as
/// backends with those roles, then the testkit's `app` user.
pub(crate) fn push_backends_and_user(out: &mut String, primary: &str, replicas: &[String]) {
    let roles = std::iter::once((primary, "primary"))
        .chain(replicas.iter().map(|r| (r.as_str(), "replica")));
    for (address, role) in roles {
        let _ = write!(
            out,
            "\n[[cluster.backend]]\naddress = \"{address}\"\nrole = \"{role}\"\n"
        );
    }
    let _ = writeln!(
        out,
        "\n[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\""
    );
}

/// Fails with the log's tail when the daemon has exited (checked between
/// runs, so a crash is reported as one, not as a failed load run).
pub(crate) fn fulcrum_alive(fulcrum: &FulcrumProcess) -> Result<()> {
    match fulcrum.try_wait() {
        None => Ok(()),
        Some(status) => Err(format!(
            "fulcrum exited with {status}; log tail:\n{}",
            tail(&fulcrum.log_contents(), 30)
        )
        .into()),
    }
}
