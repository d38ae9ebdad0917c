//! Cancel keys: each client gets a Fulcrum-issued process id and secret; a
//! CancelRequest carrying them is sent on to the server connection running
//! that client's work at that moment, and to no other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::conn::CancelKey;
use crate::backend::connect::send_cancel;

#[derive(Debug)]
pub struct CancelSlot {
    pub process_id: i32,
    pub secret_key: i32,
    target: Mutex<Option<Arc<CancelKey>>>,
}

impl CancelSlot {
    /// Sets (on attach) or clears (on detach) the server this client is on.
    pub fn set_target(&self, key: Option<Arc<CancelKey>>) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = key;
    }
}

#[derive(Debug)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<i32, Arc<CancelSlot>>>,
    next: AtomicI32,
}

impl Default for CancelRegistry {
    fn default() -> Self {
        CancelRegistry {
            clients: Mutex::new(HashMap::new()),
            next: AtomicI32::new(rand::random_range(1..1 << 30)),
        }
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

impl CancelRegistry {
    pub fn register(self: &Arc<Self>) -> Registration {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let process_id = loop {
            let id = self.next.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
            if id != 0 && !clients.contains_key(&id) {
                break id;
            }
        };
        let slot = Arc::new(CancelSlot {
            process_id,
            secret_key: rand::random(),
            target: Mutex::new(None),
        });
        clients.insert(process_id, slot.clone());
        Registration {
            registry: self.clone(),
            slot,
        }
    }

    /// The server to cancel for a client's key, if the key is right and the
    /// client is running something.
    pub fn target(&self, process_id: i32, secret_key: i32) -> Option<Arc<CancelKey>> {
        let slot = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&process_id)
            .cloned()?;
        if slot.secret_key != secret_key {
            return None;
        }
        let target = slot
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        target
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
        a.slot.set_target(Some(Arc::new(key(42))));
        b.slot.set_target(Some(Arc::new(key(43))));
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
    }
}
