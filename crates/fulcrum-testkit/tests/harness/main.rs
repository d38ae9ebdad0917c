//! The harness's own end-to-end checks, one test binary: the daemon process
//! wrapper against a fake daemon (`fulcrum_process`), a real PostgreSQL
//! cluster (`smoke`) and a real MariaDB cluster (`maria_smoke`), and the
//! reaper that stops the servers of a test process that died (`reaper`).

mod fulcrum_process;
mod maria_smoke;
mod reaper;
mod smoke;
