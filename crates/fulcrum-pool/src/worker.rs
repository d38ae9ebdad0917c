//! Which worker event loop the current thread is. With `workers` > 1 each
//! worker thread runs an event loop of its own and a client's session stays
//! on one for life (`fulcrum_cluster::workers`); a server connection's
//! socket belongs to the loop that opened it, so the pools hand a client
//! the connections its own worker opened first ([`crate::Pool`]): a unit's
//! I/O then never crosses threads. Threads that are not workers (the
//! control thread, tests) all count as one, [`NONE`].

use std::cell::Cell;

/// The worker id of a thread that is not a worker.
pub const NONE: usize = usize::MAX;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(NONE) };
}

/// The current thread's worker id ([`NONE`] for a thread that is not one).
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

/// Marks the current thread as worker `id` (called once, as it starts).
pub fn enter(id: usize) {
    CURRENT.with(|c| c.set(id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_no_worker_until_it_enters_one() {
        let seen = std::thread::spawn(|| {
            let before = current();
            enter(3);
            (before, current())
        })
        .join()
        .unwrap();
        assert_eq!(seen, (NONE, 3));
        // Another thread is unaffected.
        assert_eq!(current(), NONE);
    }
}
