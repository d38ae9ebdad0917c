//! Backend selection: the seam where routing plugs in. A statement's route
//! (primary or replica) goes in, a backend index comes out. For now every
//! route resolves to the primary; the SQL-routing and balancing work replaces
//! `pick` without touching the protocol crates.

/// Index of a backend in its cluster's configuration order.
pub type BackendId = usize;

/// Where a unit of work must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Writes, transactions, anything that must see the primary.
    Primary,
    /// Reads that a replica may serve.
    Replica,
}

/// Picks backends for one cluster.
#[derive(Debug, Clone)]
pub struct Router {
    primary: BackendId,
    backends: usize,
}

impl Router {
    /// `primary` is the index of the backend configured as primary (or the
    /// first `auto` one until role detection exists).
    pub fn new(primary: BackendId, backends: usize) -> Router {
        assert!(primary < backends, "primary index within the backend list");
        Router { primary, backends }
    }

    pub fn primary(&self) -> BackendId {
        self.primary
    }

    pub fn backend_count(&self) -> usize {
        self.backends
    }

    /// The backend for `route`. Replica reads go to the primary until the
    /// routing work lands.
    pub fn pick(&self, route: Route) -> BackendId {
        match route {
            Route::Primary | Route::Replica => self.primary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_goes_to_the_primary_for_now() {
        let r = Router::new(1, 3);
        assert_eq!(r.pick(Route::Primary), 1);
        assert_eq!(r.pick(Route::Replica), 1);
    }
}
