//! The I/O floor of candidate session drivers (issue 44, item 4): a 1:1 TCP
//! forwarder, one PostgreSQL server connection opened per accepted client,
//! with no pooling and no parsing, driven several ways. Whatever such a byte
//! pipe costs per `pgbench -S` transaction is the least a session loop on
//! that driver can cost; Fulcrum's own work is the budget above it
//! (docs/architecture.md, "Toward a unit in 5,000 instructions").
//!
//! This file owns the command line and the choice of driver;
//! `tokio_loop.rs`, `mio_loop.rs` and `exec_loop.rs` own the loops.
//!
//! ```text
//! cargo bench --bench driver_floor --no-run   # prints the binary's path
//! driver_floor --driver tokio|tokio-notime|tokio-short|mio|mio-short|exec-mio|exec-mio-short|exec-mio-deadline \
//!     --listen 127.0.0.1:6612 --server 127.0.0.1:6611 [--idle SECONDS]
//! ```
//!
//! - `tokio`: a current_thread runtime with the I/O and time drivers (as
//!   Fulcrum's `workers = 1`), one task per client;
//! - `tokio-notime`: the same without the time driver (`enable_io()` only);
//! - `mio`: one thread, one `mio::Poll`, every socket edge-triggered;
//! - `tokio-short`, `mio-short`: `tokio` and `mio`, taking a short read as
//!   the socket drained (epoll(7)), so one `recv` per readable event
//!   instead of a second one that returns `WouldBlock`;
//! - `exec-mio`, `exec-mio-short`: `tokio`'s task, as an `async fn`, on a
//!   minimal single-threaded executor of our own whose reactor is one
//!   `mio::Poll` (edge-triggered, readiness bits and a waker per socket),
//!   without and with the short-read rule;
//! - `exec-mio-deadline`: `exec-mio-short` whose task waits with an idle
//!   deadline (`--idle`, 600 s by default): a tick counted by a timerfd,
//!   a per-worker sweep that wakes the tasks past theirs, no timer per task
//!   and no clock read per wait.
//!
//! Startup and authentication pass through untouched (a byte pipe), so any
//! method the server asks for works; run the clients with
//! `PGSSLMODE=disable` (an SSLRequest would be forwarded as is too).
//! It runs until killed (SIGINT or SIGTERM). A plain `cargo bench`, which
//! runs every bench target with `--bench` alone, finds nothing to do here.

mod exec_loop;
mod mio_loop;
mod tokio_loop;

use std::net::SocketAddr;
use std::process::ExitCode;

/// Room for one read: a `pgbench -S` message is far smaller.
pub const BUF: usize = 16 * 1024;

fn main() -> ExitCode {
    // A shell without job control starts background commands with SIGINT
    // ignored, and tools/instructions-per-transaction stops its command
    // with SIGINT: take the default action back.
    // SAFETY: setting a signal's disposition to its default runs no code.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    let mut driver = None;
    let mut from_cargo = false;
    let mut listen: Option<SocketAddr> = None;
    let mut server: Option<SocketAddr> = None;
    // Seconds a client may stay silent under `exec-mio-deadline`.
    let mut idle: u64 = 600;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--driver" => driver = args.next(),
            "--listen" => listen = args.next().and_then(|a| a.parse().ok()),
            "--server" => server = args.next().and_then(|a| a.parse().ok()),
            "--idle" => idle = args.next().and_then(|a| a.parse().ok()).unwrap_or(idle),
            // What `cargo bench` passes to every bench target.
            "--bench" => from_cargo = true,
            other => {
                eprintln!("driver_floor: unknown argument {other}");
                return ExitCode::FAILURE;
            }
        }
    }
    if from_cargo && driver.is_none() {
        // A plain `cargo bench` runs every bench target: this one is a
        // server to measure from outside, so it has nothing to do then.
        eprintln!("driver_floor: a forwarder measured from outside; see the file's doc");
        return ExitCode::SUCCESS;
    }
    let (Some(driver), Some(listen), Some(server)) = (driver, listen, server) else {
        eprintln!(
            "usage: driver_floor --driver \
             tokio|tokio-notime|tokio-short|mio|mio-short|exec-mio|exec-mio-short|exec-mio-deadline \
             --listen ADDR --server ADDR [--idle SECONDS]"
        );
        return ExitCode::FAILURE;
    };
    let run = match driver.as_str() {
        "tokio" => tokio_loop::run(listen, server, true, false),
        "tokio-notime" => tokio_loop::run(listen, server, false, false),
        "tokio-short" => tokio_loop::run(listen, server, true, true),
        "mio" => mio_loop::run(listen, server, false),
        "mio-short" => mio_loop::run(listen, server, true),
        "exec-mio" => exec_loop::run(listen, server, false, None),
        "exec-mio-short" => exec_loop::run(listen, server, true, None),
        "exec-mio-deadline" => exec_loop::run(listen, server, true, Some(idle)),
        other => {
            eprintln!("driver_floor: unknown driver {other}");
            return ExitCode::FAILURE;
        }
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("driver_floor: {e}");
            ExitCode::FAILURE
        }
    }
}
