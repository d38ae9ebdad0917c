//! Cancel keys: each client gets a Fulcrum-issued process id and secret, or,
//! when its server connection is its own for the whole session (session
//! pooling), that server's ([`CancelRegistry::alias`]), so the pid it sees
//! is the one `pg_stat_activity`, `pg_terminate_backend` and notifications
//! show. A CancelRequest carrying either is sent on to the server
//! connection running that client's work at that moment, and to no other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fulcrum_cluster::clients::ClientEntry;

use crate::backend::conn::CancelKey;
use crate::backend::connect::send_cancel;

/// One client's cancel key and the server its work runs on. Only the
/// client's session writes it; a CancelRequest reads it from any task.
#[derive(Debug)]
pub struct CancelSlot {
    pub process_id: i32,
    pub secret_key: i32,
    /// The server connection the client was last attached to, kept after
    /// the detach (`running` says whether it is still the client's) so that
    /// attaching to the same connection again takes no lock.
    target: Mutex<Option<Arc<CancelKey>>>,
    /// The address of the key `target` holds (null: none): the session's
    /// own check, without the lock, of whether `target` must change. The
    /// slot holds that `Arc`, so its address cannot be reused meanwhile.
    held: AtomicPtr<CancelKey>,
    /// The client runs work on `target` now (attached).
    running: AtomicBool,
    /// Whose client it is, and its registry entry (a terminate kills it).
    owner: Option<(Arc<str>, Arc<ClientEntry>)>,
}

impl CancelSlot {
    /// Sets (on attach) or clears (on detach) the server this client is on.
    /// A detach and an attach to the connection held already are one
    /// atomic store each (issue 44: the mutex was taken twice per unit);
    /// an attach to another connection stores its key first, under the
    /// lock, then marks the client running, so a reader that sees it
    /// running reads that key or a later one, never one the client left.
    pub fn set_target(&self, key: Option<&Arc<CancelKey>>) {
        let Some(key) = key else {
            self.running.store(false, Ordering::Release);
            return;
        };
        let ptr = Arc::as_ptr(key).cast_mut();
        if self.held.load(Ordering::Relaxed) != ptr {
            // Off first: a reader between the two stores finds no target
            // rather than the connection the client left.
            self.running.store(false, Ordering::Release);
            let mut target = self.target.lock().unwrap_or_else(|e| e.into_inner());
            *target = Some(key.clone());
            self.held.store(ptr, Ordering::Relaxed);
        }
        self.running.store(true, Ordering::Release);
    }

    /// The server the client's work runs on now, if it runs any.
    fn current(&self) -> Option<Arc<CancelKey>> {
        if !self.running.load(Ordering::Acquire) {
            return None;
        }
        let target = self.target.lock().unwrap_or_else(|e| e.into_inner());
        target.clone()
    }
}

#[derive(Debug)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<i32, Arc<CancelSlot>>>,
    /// Clients given their server's key: (server pid, server secret).
    aliases: Mutex<HashMap<(i32, i32), Arc<CancelSlot>>>,
    next: AtomicI32,
}

impl Default for CancelRegistry {
    fn default() -> Self {
        CancelRegistry {
            clients: Mutex::new(HashMap::new()),
            aliases: Mutex::new(HashMap::new()),
            next: AtomicI32::new(rand::random_range(1..1 << 30)),
        }
    }
}

/// A client known by its server's key; removed when dropped.
pub struct Alias {
    registry: Arc<CancelRegistry>,
    key: (i32, i32),
}

impl Drop for Alias {
    fn drop(&mut self) {
        self.registry
            .aliases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// Removes the client's slot when its session ends.
pub struct Registration {
    registry: Arc<CancelRegistry>,
    pub slot: Arc<CancelSlot>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.slot.process_id);
    }
}

/// What [`CancelRegistry::signal`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// No Fulcrum client has that pid: the server's to answer.
    NotOurs,
    /// A client of another user: PostgreSQL's 42501.
    Denied,
    /// Terminated, or its running statement cancelled.
    Done,
}

impl CancelRegistry {
    pub fn register(self: &Arc<Self>) -> Registration {
        self.register_for(None)
    }

    /// `register`, for a client of `owner` (its user and registry entry):
    /// `pg_terminate_backend` / `pg_cancel_backend` of its pid reach it.
    pub fn register_for(
        self: &Arc<Self>,
        owner: Option<(Arc<str>, Arc<ClientEntry>)>,
    ) -> Registration {
        self.register_as(owner, None)
    }

    /// `register_for` a client handed over by a binary upgrade's old
    /// process, under the key it was given there (`kept`), so its cancel
    /// requests and `pg_terminate_backend` of its pid reach it here. A pid
    /// taken meanwhile by a client of this process gets a new one (logged:
    /// the client's cancels then do not reach it).
    pub fn register_as(
        self: &Arc<Self>,
        owner: Option<(Arc<str>, Arc<ClientEntry>)>,
        kept: Option<(i32, i32)>,
    ) -> Registration {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let kept = kept.filter(|(pid, _)| {
            let free = *pid > 0 && !clients.contains_key(pid);
            if !free {
                tracing::warn!(pid, "upgrade: a handed-over client's process id is taken here; its cancel key changes");
            }
            free
        });
        let (process_id, secret_key) = match kept {
            Some(key) => key,
            None => loop {
                let id = self.next.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
                if id != 0 && !clients.contains_key(&id) {
                    break (id, rand::random());
                }
            },
        };
        let slot = Arc::new(CancelSlot {
            process_id,
            secret_key,
            target: Mutex::new(None),
            held: AtomicPtr::new(std::ptr::null_mut()),
            running: AtomicBool::new(false),
            owner,
        });
        clients.insert(process_id, slot.clone());
        Registration {
            registry: self.clone(),
            slot,
        }
    }

    /// Makes `slot`'s client known by its server's key too (the key it was
    /// sent); `None` when another client already is (the same pid and
    /// secret on two servers), and it keeps its Fulcrum-issued key.
    pub fn alias(self: &Arc<Self>, server: &CancelKey, slot: &Arc<CancelSlot>) -> Option<Alias> {
        let key = (server.process_id, server.secret_key);
        let mut aliases = self.aliases.lock().unwrap_or_else(|e| e.into_inner());
        if aliases.contains_key(&key) {
            return None;
        }
        aliases.insert(key, slot.clone());
        Some(Alias {
            registry: self.clone(),
            key,
        })
    }

    /// The server to cancel for a client's key, if the key is right and the
    /// client is running something.
    pub fn target(&self, process_id: i32, secret_key: i32) -> Option<Arc<CancelKey>> {
        let issued = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&process_id)
            .filter(|slot| slot.secret_key == secret_key)
            .cloned();
        let slot = match issued {
            Some(slot) => slot,
            None => self
                .aliases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(process_id, secret_key))
                .cloned()?,
        };
        slot.current()
    }

    /// A client here was given this key (whether or not it runs anything).
    pub fn knows(&self, process_id: i32, secret_key: i32) -> bool {
        let issued = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&process_id)
            .is_some_and(|slot| slot.secret_key == secret_key);
        issued
            || self
                .aliases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&(process_id, secret_key))
    }

    /// `pg_terminate_backend(pid)` (`terminate`) or `pg_cancel_backend(pid)`
    /// of a Fulcrum-issued pid, asked by a client of `user`: as the server
    /// does, only a client of the same user may be signalled.
    pub fn signal(&self, pid: i32, user: &str, terminate: bool, timeout: Duration) -> Signal {
        let slot = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pid)
            .cloned();
        let Some((owner, entry)) = slot.as_ref().and_then(|s| s.owner.clone()) else {
            return Signal::NotOurs;
        };
        if *owner != *user {
            return Signal::Denied;
        }
        if terminate {
            entry.kill();
        } else if let Some(key) = slot.and_then(|s| s.current()) {
            tokio::spawn(async move {
                if let Err(e) = send_cancel(&key, timeout).await {
                    tracing::warn!(server = %key.address, error = %e, "could not send pg_cancel_backend's cancel");
                }
            });
        }
        Signal::Done
    }

    /// Forwards a CancelRequest; unknown keys are ignored, as PostgreSQL does.
    pub async fn cancel(&self, process_id: i32, secret_key: i32, timeout: Duration) {
        match self.target(process_id, secret_key) {
            Some(key) => {
                if let Err(e) = send_cancel(&key, timeout).await {
                    tracing::warn!(server = %key.address, error = %e, "could not forward cancel request");
                }
            }
            None => tracing::debug!(process_id, "cancel request for no running query, ignored"),
        }
    }

    pub fn len(&self) -> usize {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A CancelRequest (no database: the cluster that knows the key among
/// `clusters`, those sharing the listener). A key none knows, after a
/// binary upgrade, goes to the old process, whose staying clients (TLS,
/// pinned) may have it.
pub async fn answer(
    clusters: &[Arc<super::context::ClusterContext>],
    process_id: i32,
    secret_key: i32,
) {
    let known = clusters
        .iter()
        .any(|c| c.cancels.knows(process_id, secret_key));
    if !known
        && fulcrum_cluster::handover::forward_cancel(
            "postgres",
            process_id as u32,
            secret_key as u32,
        )
    {
        return;
    }
    let owner = clusters
        .iter()
        .find(|c| c.cancels.target(process_id, secret_key).is_some())
        .unwrap_or(&clusters[0]);
    owner
        .cancels
        .cancel(process_id, secret_key, owner.config.connect_timeout)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pid: i32) -> CancelKey {
        CancelKey {
            address: "127.0.0.1:1".into(),
            process_id: pid,
            secret_key: 9,
            tls: None,
        }
    }

    #[test]
    fn only_the_right_secret_and_a_running_client_give_a_target() {
        let reg = Arc::new(CancelRegistry::default());
        let a = reg.register();
        let b = reg.register();
        assert_ne!(a.slot.process_id, b.slot.process_id);
        assert!(
            reg.target(a.slot.process_id, a.slot.secret_key).is_none(),
            "idle client"
        );
        a.slot.set_target(Some(&Arc::new(key(42))));
        b.slot.set_target(Some(&Arc::new(key(43))));
        assert_eq!(
            reg.target(a.slot.process_id, a.slot.secret_key)
                .unwrap()
                .process_id,
            42
        );
        assert!(reg
            .target(a.slot.process_id, a.slot.secret_key.wrapping_add(1))
            .is_none());
        let pid = a.slot.process_id;
        drop(a);
        assert!(reg.target(pid, 0).is_none());
        assert_eq!(reg.len(), 1);
        // b known by its server's key too, until the alias goes.
        let server = key(43);
        let alias = reg.alias(&server, &b.slot).expect("free");
        assert!(reg.alias(&server, &b.slot).is_none(), "taken");
        assert_eq!(reg.target(43, 9).unwrap().process_id, 43);
        assert!(reg.target(43, 8).is_none(), "wrong secret");
        drop(alias);
        assert!(reg.target(43, 9).is_none());
    }

    #[test]
    fn a_cancel_reaches_the_connection_attached_now_and_none_after_the_detach() {
        let reg = Arc::new(CancelRegistry::default());
        let a = reg.register();
        let (pid, secret) = (a.slot.process_id, a.slot.secret_key);
        let (x, y) = (Arc::new(key(42)), Arc::new(key(43)));
        a.slot.set_target(Some(&x));
        assert_eq!(reg.target(pid, secret).unwrap().process_id, 42);
        a.slot.set_target(None);
        assert!(
            reg.target(pid, secret).is_none(),
            "left x: kept, not a target"
        );
        a.slot.set_target(Some(&x));
        assert_eq!(reg.target(pid, secret).unwrap().process_id, 42, "x again");
        a.slot.set_target(None);
        a.slot.set_target(Some(&y));
        assert_eq!(reg.target(pid, secret).unwrap().process_id, 43, "now y");
        // An attach straight to another connection (a replay's) moves too.
        a.slot.set_target(Some(&x));
        assert_eq!(reg.target(pid, secret).unwrap().process_id, 42);
        a.slot.set_target(None);
        assert!(reg.target(pid, secret).is_none());
    }
}
