//! The DNS cache for server addresses (`dns_max_ttl`, PgBouncer's name):
//! a backend's `host:port` is resolved at most once per `dns_max_ttl`, and
//! a connection tries each address the name gave, in order, until one
//! answers. An address that is already an IP (`10.0.0.5:5432`, `[::1]:5432`)
//! is never looked up. With `dns_max_ttl = 0` every connection resolves
//! the name again (tokio's `lookup_host`, the system resolver).
//!
//! The resolver's own TTLs are not visible through `getaddrinfo`, so the
//! cache keeps an answer for `dns_max_ttl` exactly, as PgBouncer does with
//! its c-ares-less build. A failed lookup is not kept.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// PgBouncer's default.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(15);

/// `dns_max_ttl` in milliseconds (set at start and on reload).
static MAX_TTL_MS: AtomicU64 = AtomicU64::new(15_000);
/// Lookups made (for the tests and SHOW DNS-like reporting).
static LOOKUPS: AtomicU64 = AtomicU64::new(0);

type Cache = Mutex<HashMap<String, (Instant, Vec<SocketAddr>)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Sets how long a name's addresses are kept (0: not kept).
pub fn set_max_ttl(ttl: Duration) {
    MAX_TTL_MS.store(ttl.as_millis() as u64, Ordering::Relaxed);
    if ttl.is_zero() {
        cache().lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Lookups made through the system resolver since start.
pub fn lookups() -> u64 {
    LOOKUPS.load(Ordering::Relaxed)
}

/// The addresses of `address` (`host:port`): parsed when it is an IP,
/// else from the cache while fresh, else looked up (and kept).
pub async fn resolve(address: &str) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = address.parse::<SocketAddr>() {
        return Ok(vec![ip]);
    }
    let ttl = Duration::from_millis(MAX_TTL_MS.load(Ordering::Relaxed));
    if !ttl.is_zero() {
        let cached = cache().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, addrs)) = cached.get(address) {
            if at.elapsed() < ttl {
                return Ok(addrs.clone());
            }
        }
    }
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(address).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{address}: the name has no address"),
        ));
    }
    if !ttl.is_zero() {
        cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(address.to_owned(), (Instant::now(), addrs.clone()));
    }
    Ok(addrs)
}

/// A TCP connection to `address`: each of its addresses in turn, the
/// last error if none answers.
pub async fn connect(address: &str) -> io::Result<TcpStream> {
    let mut last = None;
    for a in resolve(address).await? {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, address.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test: the TTL and the counter are process-wide.
    #[tokio::test]
    async fn names_are_kept_for_the_ttl_and_ips_never_looked_up() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let name = format!("localhost:{port}");
        set_max_ttl(Duration::from_millis(300));
        let before = lookups();
        let first = resolve(&name).await.unwrap();
        assert!(first.iter().any(|a| a.port() == port), "{first:?}");
        resolve(&name).await.unwrap();
        assert_eq!(lookups() - before, 1, "the second is the cache's");
        tokio::time::sleep(Duration::from_millis(350)).await;
        resolve(&name).await.unwrap();
        assert_eq!(lookups() - before, 2, "looked up again after the TTL");
        resolve(&format!("127.0.0.1:{port}")).await.unwrap();
        assert_eq!(lookups() - before, 2, "an IP is not looked up");
        set_max_ttl(Duration::ZERO);
        resolve(&name).await.unwrap();
        resolve(&name).await.unwrap();
        assert_eq!(lookups() - before, 4, "no cache with dns_max_ttl = 0");
        // localhost may give ::1 first, where nothing listens: the next
        // address is tried.
        let s = connect(&name).await.unwrap();
        assert_eq!(s.peer_addr().unwrap().port(), port);
        let e = resolve("no-such-host.invalid:5432").await.unwrap_err();
        assert!(!e.to_string().is_empty());
        set_max_ttl(DEFAULT_MAX_TTL);
    }
}
