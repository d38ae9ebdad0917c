//! Read buffers an idle client gives back, kept per thread for the next
//! read (PgBouncer's `iobuf` cache does the same): an idle logged-in client
//! holds no buffer (issue 44: memory per idle client), and a busy one
//! gets its buffer back without a `malloc`, a pop from this thread's list.
//!
//! The list is bounded ([`SPARE_MAX`]); a buffer given back to a full list
//! is freed. Each worker thread has its own list, so there is no lock; a
//! buffer allocated on one thread and given back on another just changes
//! lists.

use std::cell::RefCell;

use bytes::BytesMut;

/// Most buffers kept per thread: a client in a unit holds its own, so the
/// list only absorbs how many end a unit at once before others start one;
/// little held when every client is idle (16 client buffers are 32 kB).
/// At 64, the 128 kB per thread were a tenth of a kilobyte per client of
/// `tools/idle-client-memory 1000` (heaptrack: the largest live
/// allocation site after the tasks), twice that with two workers.
pub const SPARE_MAX: usize = 16;

/// Largest buffer kept: one that grew for a large message is freed, not
/// handed to the next idle read.
const SPARE_MAX_CAPACITY: usize = 4 * crate::CLIENT_READ_CHUNK;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A buffer with room for `chunk` bytes: a spare one when this thread has
/// one, else a new one.
pub(crate) fn take(chunk: usize) -> BytesMut {
    let spare = SPARE.with(|s| s.borrow_mut().pop());
    match spare {
        Some(mut buf) => {
            // Reclaims the whole allocation when nothing else shares it
            // (frames split off it are gone), else allocates afresh.
            buf.reserve(chunk);
            buf
        }
        None => BytesMut::with_capacity(chunk),
    }
}

/// Keeps the empty `buf` for the next [`take`] on this thread (or frees it
/// when the list is full or the buffer grew large).
pub(crate) fn give(mut buf: BytesMut) {
    debug_assert!(buf.is_empty());
    buf.clear();
    if buf.capacity() == 0 || buf.capacity() > SPARE_MAX_CAPACITY {
        return;
    }
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_MAX {
            s.push(buf);
        }
    });
}

/// Buffers kept on this thread now (tests).
#[cfg(test)]
pub(crate) fn kept() -> usize {
    SPARE.with(|s| s.borrow().len())
}
