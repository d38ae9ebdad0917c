//! The MySQL adapter's one call to the routing decision: a command's
//! classification and the client's state in, `fulcrum_session::decide` out.
//! COM_QUERY and the prepared-statement commands route through here alike.

use fulcrum_pool::{Need, Route};
use fulcrum_session::{decide, Facts, Target, Txn};
use fulcrum_sql::Decision;
use mysql_common::constants::StatusFlags;

use super::Session;

impl Session {
    /// Where a command classified `decision` goes; a pin it sets is applied.
    pub(super) fn route_unit(&mut self, decision: Decision) -> Route {
        let in_txn = self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            || !self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        let routing = decide(&Facts {
            decision,
            complete: true,
            executes: true,
            txn: if in_txn { Txn::Open } else { Txn::None },
            pinned: self.engine.pinned().is_some(),
            attached: self.server.is_some(),
            hint: self.unit_consistency,
            session: self.consistency,
            position_unknown: self.causal.need() == &Need::Unknown,
            default_route: self.ctx.config.default_route,
        });
        if let Some(reason) = routing.pin {
            self.pin(reason);
        }
        self.unit_may_write = routing.may_write;
        match routing.target {
            Target::Go(route) => route,
            // On the connection it holds: the route is not used.
            Target::Stay => Route::Primary,
        }
    }
}
