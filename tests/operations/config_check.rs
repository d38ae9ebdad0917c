//! `fulcrum check --config FILE` as users run it: the real binary on the shipped
//! examples (exit 0) and on broken files (exit 2, one `file:line: key: reason`
//! line on stderr), plus the daemon's own refusal of a missing file.
//!
//! Needs the daemon binary: `cargo build -p fulcrum` (see `fulcrum_testkit::fulcrum_bin`).
//!
//! Split by theme: `check` (`fulcrum check` on valid, broken and missing
//! files, passwords from files and the environment, `--connect`) and
//! `import_pgbouncer` (converting pgbouncer.ini); shared temp dirs and runs in
//! `helpers`.

mod check;
mod helpers;
mod import_pgbouncer;
