//! A binary upgrade's client hand-over, the same for every protocol. Once
//! the new process serves, the old one opens the [`Sink`] on the upgrade
//! socket and raises the hand-over on every client
//! (`ClientRegistry::hand_over_all`). Each session, at its next
//! transaction boundary, either sends its socket and its protocol's
//! snapshot through the sink and ends without a word to the client, or
//! says why it stays ([`Stay`]: TLS, a pin). The new process
//! ([`receive`]) passes each client to the listener serving its cluster
//! ([`inbox`]), which resumes the session (`Frontend::resume`) under its
//! `max_client_connections`. What the protocol's snapshot holds, and how
//! a session resumes from it, is the protocol's; the socket, who the client
//! is, the tally of who moved and who stayed, and the routing to a
//! listener are here. A cancel request the new process cannot place (its
//! client stayed on the old process) goes back on the same socket
//! ([`forward_cancel`], [`on_cancel`]). The messages are [`wire`]'s.

pub mod wire;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use fulcrum_net::listener::StdAccepted;
use tokio::sync::mpsc;

use crate::clients::{self, Stay};
pub use wire::{ClientHead, Tally};

/// How long sending one client may block before the hand-over is given up
/// (the client then stays here).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The old process's end of the hand-over: one message at a time.
pub struct Sink {
    /// `None` once a send failed: nothing more is sent.
    stream: Mutex<Option<UnixStream>>,
    handed_over: AtomicU64,
    closed: AtomicU64,
    /// Clients staying now, by reason (kept as they change, so a report
    /// costs no walk over every client).
    left_tls: AtomicU64,
    left_pinned: AtomicU64,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// The new process serves: clients may be sent to it on `stream` (the
/// upgrade socket), and every session is asked to move at its next
/// transaction boundary.
pub fn open(stream: UnixStream) {
    let _ = stream.set_write_timeout(Some(SEND_TIMEOUT));
    // The new process's cancel requests for clients still here.
    if let Ok(reader) = stream.try_clone() {
        let _ = reader.set_read_timeout(None);
        let spawned = std::thread::Builder::new()
            .name("fulcrum-handover-cancels".into())
            .spawn(move || take_cancels(reader));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "upgrade: cancel requests for the clients staying here will not reach them");
        }
    }
    let sink = Sink {
        stream: Mutex::new(Some(stream)),
        handed_over: AtomicU64::new(0),
        closed: AtomicU64::new(0),
        left_tls: AtomicU64::new(0),
        left_pinned: AtomicU64::new(0),
    };
    if SINK.set(sink).is_ok() {
        clients::registry().hand_over_all();
    }
}

/// The sink, once an upgrade has opened it.
pub fn sink() -> Option<&'static Sink> {
    SINK.get()
}

impl Sink {
    /// Whether a session asked to move can go: one with no socket to move
    /// (TLS) or a `pinned` one stays, the reason recorded on its `entry`.
    pub fn may_move(
        &self,
        entry: &clients::ClientEntry,
        socket: Option<BorrowedFd<'_>>,
        pinned: bool,
    ) -> bool {
        let stay = match (socket, pinned) {
            (None, _) => Some(Stay::Tls),
            (Some(_), true) => Some(Stay::Pinned),
            (Some(_), false) => None,
        };
        if stay.is_some() {
            self.stays(entry, stay);
        }
        stay.is_none()
    }

    /// [`send_client`](Self::send_client), for a session: true when the
    /// client is the new process's now (the session ends without a word to
    /// it), false when it stays here.
    ///
    /// The send runs on tokio's blocking pool with a copy of the socket's
    /// descriptor: a new process slow to read (up to the send timeout) holds
    /// that thread, not the worker serving this session's neighbours.
    pub async fn hand_over(&'static self, head: ClientHead, socket: BorrowedFd<'_>) -> bool {
        let socket = match socket.try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(error = %e, "upgrade: cannot copy a client's socket; it stays here");
                return false;
            }
        };
        let send = move || self.send_client(&head, socket.as_fd()).is_ok();
        let moved = tokio::task::spawn_blocking(send).await.unwrap_or(false);
        if moved {
            tracing::debug!("client handed over to the new process");
        }
        moved
    }

    /// Sends a client: on `Ok` its socket is the new process's, and the
    /// session here ends without writing to it; on an error it stays here
    /// (and the sink is closed: nothing more is sent).
    pub fn send_client(&self, head: &ClientHead, socket: BorrowedFd<'_>) -> io::Result<()> {
        let body = wire::encode_client(head);
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = stream.as_ref() else {
            return Err(io::Error::other(
                "the hand-over to the new process failed before",
            ));
        };
        let sent = wire::send(s, wire::CLIENT, &body, Some(socket));
        if let Err(e) = &sent {
            tracing::warn!(error = %e, "upgrade: cannot hand a client over; the remaining clients stay here");
            *stream = None;
            return sent;
        }
        self.handed_over.fetch_add(1, Ordering::Relaxed);
        drop(stream);
        self.report();
        sent
    }

    /// A session asked to move stays (or no longer stays: `None`) for the
    /// reason given: recorded on its entry and reported.
    pub fn stays(&self, entry: &clients::ClientEntry, why: Option<Stay>) {
        let was = entry.stay();
        if was != why {
            entry.set_stay(why);
            self.count_stay(was, -1);
            self.count_stay(why, 1);
            self.report();
        }
    }

    /// A client that stayed here (for `why`) has gone: it moved, left, or
    /// was closed.
    pub(crate) fn gone(&self, why: Stay) {
        self.count_stay(Some(why), -1);
        self.report();
    }

    fn count_stay(&self, why: Option<Stay>, delta: i64) {
        let counter = match why {
            Some(Stay::Tls) => &self.left_tls,
            Some(Stay::Pinned) => &self.left_pinned,
            None => return,
        };
        if delta > 0 {
            counter.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
        }
    }

    /// `n` clients were ended here by `upgrade_timeout`.
    pub fn closed(&self, n: u64) {
        self.closed.fetch_add(n, Ordering::Relaxed);
        self.report();
    }

    /// The counts now: moved, staying (by reason), closed.
    pub fn tally(&self) -> Tally {
        Tally {
            handed_over: self.handed_over.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            left_tls: self.left_tls.load(Ordering::Relaxed),
            left_pinned: self.left_pinned.load(Ordering::Relaxed),
        }
    }

    /// Tells the new process the counts (best effort: SHOW UPGRADE there).
    fn report(&self) {
        let body = self.tally().encode();
        let stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = stream.as_ref() {
            let _ = wire::send(s, wire::TALLY, &body, None);
        }
    }
}

/// What the old process does with a cancel request the new one forwards:
/// (protocol, process id, secret key).
type CancelHook = Box<dyn Fn(&str, u32, u32) + Send + Sync>;

static CANCEL_HOOK: OnceLock<CancelHook> = OnceLock::new();

/// The old process: how a forwarded cancel request is carried out (set
/// once, by the daemon, before the sink opens).
pub fn on_cancel(hook: impl Fn(&str, u32, u32) + Send + Sync + 'static) {
    let _ = CANCEL_HOOK.set(Box::new(hook));
}

/// The old process's reader of the upgrade socket: forwarded cancel
/// requests, until the new process closes it.
fn take_cancels(stream: UnixStream) {
    while let Ok(Some((kind, body, _))) = wire::recv(&stream) {
        let Some((protocol, pid, secret)) = (kind == wire::CANCEL)
            .then(|| wire::decode_cancel(&body))
            .flatten()
        else {
            continue;
        };
        match CANCEL_HOOK.get() {
            Some(hook) => hook(&protocol, pid, secret),
            None => tracing::debug!("upgrade: a forwarded cancel request with nowhere to go"),
        }
    }
}

/// The new process's way back to the old one, while it runs.
static UPSTREAM: Mutex<Option<UnixStream>> = Mutex::new(None);

/// The new process: a cancel request for a key no client here has goes to
/// the old process, whose clients (TLS, pinned) may have it. False when
/// there is no old process (any more).
pub fn forward_cancel(protocol: &str, process_id: u32, secret: u32) -> bool {
    let mut upstream = UPSTREAM.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = upstream.as_ref() else {
        return false;
    };
    let body = wire::encode_cancel(protocol, process_id, secret);
    if wire::send(s, wire::CANCEL, &body, None).is_err() {
        *upstream = None;
        return false;
    }
    true
}

/// A client handed over by the old process, for its cluster's listener.
pub struct Arrival {
    pub head: ClientHead,
    pub socket: StdAccepted,
}

/// Where arrivals go, by cluster name.
fn inboxes() -> &'static Mutex<HashMap<String, mpsc::UnboundedSender<Arrival>>> {
    static INBOXES: OnceLock<Mutex<HashMap<String, mpsc::UnboundedSender<Arrival>>>> =
        OnceLock::new();
    INBOXES.get_or_init(Mutex::default)
}

/// The clients handed over to the listener serving `clusters` (those
/// sharing its port): made before the listener runs, so none handed over
/// early is lost.
pub fn inbox(clusters: &[String]) -> mpsc::UnboundedReceiver<Arrival> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut map = inboxes().lock().unwrap_or_else(|e| e.into_inner());
    for name in clusters {
        map.insert(name.clone(), tx.clone());
    }
    rx
}

/// The new process's side: takes clients from the old process on `stream`
/// until it closes (the old process has exited), passing each to its
/// cluster's listener; each tally goes to `on_tally`. Blocking: run on a
/// thread of its own.
pub fn receive(stream: UnixStream, mut on_tally: impl FnMut(Tally)) {
    let _ = stream.set_read_timeout(None);
    if let Ok(writer) = stream.try_clone() {
        let _ = writer.set_write_timeout(Some(SEND_TIMEOUT));
        *UPSTREAM.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
    }
    loop {
        let (kind, body, fd) = match wire::recv(&stream) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "upgrade: the old process's hand-over stream failed");
                break;
            }
        };
        match (kind, fd) {
            (wire::TALLY, _) => {
                if let Some(t) = Tally::decode(&body) {
                    on_tally(t);
                }
            }
            (wire::CLIENT, Some(fd)) => arrive(&body, fd),
            _ => tracing::warn!(kind, "upgrade: a hand-over message not understood"),
        }
    }
    *UPSTREAM.lock().unwrap_or_else(|e| e.into_inner()) = None;
    tracing::info!("upgrade: the old process has exited");
}

/// One client from the old process, to its cluster's listener; one this
/// process cannot take is closed (the client connects again).
fn arrive(body: &[u8], fd: OwnedFd) {
    let Some(head) = wire::decode_client(body) else {
        tracing::warn!("upgrade: a handed-over client's message not understood: closed");
        return;
    };
    let socket = if head.unix {
        StdAccepted::Unix(fd.into())
    } else {
        StdAccepted::Tcp(fd.into())
    };
    let map = inboxes().lock().unwrap_or_else(|e| e.into_inner());
    let Some(tx) = map.get(&head.cluster) else {
        tracing::warn!(cluster = %head.cluster, "upgrade: a client of a cluster this config does not have: closed");
        return;
    };
    let cluster = head.cluster.clone();
    if tx.send(Arrival { head, socket }).is_err() {
        tracing::warn!(%cluster, "upgrade: a client arrived after its listener stopped: closed");
    }
}
