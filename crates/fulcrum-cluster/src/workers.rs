//! The worker event loops behind `workers` > 1: each worker thread runs a
//! single-threaded runtime of its own, and a client's session runs on one
//! of them for life (the one with the fewest sessions when it logs in).
//! Its server connections are those its worker opened
//! (`fulcrum_pool::worker`), so the I/O of a unit (client socket, server
//! socket, the session's task) stays on one thread: no wake-up crosses
//! threads, as none does with `workers = 1`. Without workers (`workers =
//! 1`, tests) a session runs on the caller's runtime.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use fulcrum_net::Accepted;
use tokio::runtime::Handle;

/// The process's workers, once started.
static WORKERS: OnceLock<Workers> = OnceLock::new();

struct Workers {
    loops: Vec<Loop>,
}

struct Loop {
    handle: Handle,
    /// Sessions running on it now.
    sessions: Arc<AtomicUsize>,
}

/// Starts `n` worker threads, each with its own runtime, for the process's
/// lifetime (they end with it). A second call does nothing.
pub fn start(n: usize) -> std::io::Result<()> {
    if WORKERS.get().is_some() {
        return Ok(());
    }
    let mut loops = Vec::with_capacity(n);
    for id in 0..n {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name(format!("fulcrum-worker-{id}"))
            .spawn(move || {
                fulcrum_pool::worker::enter(id);
                runtime.block_on(std::future::pending::<()>());
            })?;
        loops.push(Loop {
            handle,
            sessions: Arc::new(AtomicUsize::new(0)),
        });
    }
    let _ = WORKERS.set(Workers { loops });
    Ok(())
}

/// Runs `session` with the accepted `stream` (TCP or Unix) on the least
/// busy worker (its socket moved to that worker's event loop), or on the
/// current runtime when there are no workers.
pub(crate) fn spawn<F, Fut>(stream: Accepted, session: F)
where
    F: FnOnce(Accepted) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let least_busy = WORKERS.get().and_then(|w| {
        w.loops
            .iter()
            .min_by_key(|l| l.sessions.load(Ordering::Relaxed))
    });
    let Some(chosen) = least_busy else {
        tokio::spawn(session(stream));
        return;
    };
    // Registered with this (the accepting) event loop; re-registered with
    // the worker's below.
    let std_stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot hand an accepted client to a worker");
            return;
        }
    };
    // Registered with the worker's event loop from here, and the session's
    // future made here: the task spawned holds that future alone, not the
    // closure it was made from beside it (issue 44: memory per idle client).
    let stream = {
        let _worker = chosen.handle.enter();
        std_stream.into_tokio()
    };
    let stream = match stream {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "a worker cannot take an accepted client");
            return;
        }
    };
    let sessions = chosen.sessions.clone();
    sessions.fetch_add(1, Ordering::Relaxed);
    chosen.handle.spawn(Counted {
        session: session(stream),
        _running: Running(sessions),
    });
}

pin_project_lite::pin_project! {
    /// A session's future, counted on its worker while it runs.
    struct Counted<Fut> {
        #[pin]
        session: Fut,
        _running: Running,
    }
}

impl<Fut: Future> Future for Counted<Fut> {
    type Output = Fut::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Fut::Output> {
        self.project().session.poll(cx)
    }
}

/// Counts a session on its worker while it runs.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sessions run on worker threads, spread over both, and the
    /// socket works there.
    #[test]
    fn sessions_run_on_the_workers_spread_by_load() {
        start(2).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut clients = Vec::new();
            for _ in 0..4 {
                clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
                let (stream, _) = listener.accept().await.unwrap();
                let stream = Accepted::Tcp(stream);
                let tx = tx.clone();
                spawn(stream, move |stream| async move {
                    use tokio::io::AsyncReadExt;
                    let Accepted::Tcp(mut stream) = stream else {
                        panic!("a TCP stream stays one");
                    };
                    let mut byte = [0u8; 1];
                    let read = stream.read_exact(&mut byte).await.is_ok();
                    let _ = tx.send((fulcrum_pool::worker::current(), read));
                    // Held until the test ends, so the next one is spread.
                    std::future::pending::<()>().await;
                });
            }
            use tokio::io::AsyncWriteExt;
            for c in &mut clients {
                c.write_all(b"x").await.unwrap();
            }
            let mut seen = Vec::new();
            for _ in 0..4 {
                seen.push(rx.recv().await.unwrap());
            }
            seen.sort();
            assert_eq!(seen, vec![(0, true), (0, true), (1, true), (1, true)]);
        });
    }
}
