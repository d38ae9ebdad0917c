//! sysbench (Debian's, with its MySQL driver) as the MySQL tests run it:
//! the test kit's `app` login on `127.0.0.1:PORT`, the output checked.

use std::process::Command;

use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};

/// Runs sysbench on `port` with `tables` tables of `table_size` rows and
/// `args` (the workload, its options, the command); returns its standard
/// output. Panics with its output if it fails.
pub fn sysbench(port: u16, tables: u32, table_size: u32, args: &[&str]) -> String {
    let out = Command::new(fulcrum_testkit::tool("/usr/bin/sysbench", "sysbench"))
        .args([
            "--db-driver=mysql",
            "--mysql-host=127.0.0.1",
            &format!("--mysql-port={port}"),
            &format!("--mysql-user={APP_USER}"),
            &format!("--mysql-password={APP_PASSWORD}"),
            &format!("--mysql-db={APP_DB}"),
            &format!("--tables={tables}"),
            &format!("--table-size={table_size}"),
        ])
        .args(args)
        .output()
        .expect("sysbench runs (installed by .ci/run)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sysbench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
