//! The MySQL adapter's one call to the routing decision: a command's
//! classification and the client's state in, `fulcrum_session::decide` out.
//! COM_QUERY and the prepared-statement commands route through here alike;
//! `route_query` also reads what a COM_QUERY changes in the session.

use fulcrum_session::{decide, Event, Facts, Routing, Txn};
use fulcrum_sql::Decision;

use super::actions::Carried;
use super::{Effects, Session, MAX_SETS};

impl Session {
    /// Where a command classified `decision` goes (a command that is not a
    /// statement, such as COM_FIELD_LIST, counts as `Decision::Primary`).
    /// A client holding a connection tells the engine of the unit now (a
    /// pin it sets is applied; a unit that needs another connection gets
    /// the held one given back, MySQL having answered the last command
    /// already); one without tells it when it attaches.
    pub(super) fn route_unit(&mut self, decision: Decision) -> Routing {
        let in_txn = self.in_transaction();
        let routing = decide(&Facts {
            decision,
            complete: true,
            executes: true,
            txn: if in_txn { Txn::Open } else { Txn::None },
            pinned: self.engine.pinned().is_some(),
            attached: self.server.is_some(),
            hint: self.reads.hint(),
            session: self.reads.session(),
            position_unknown: self.reads.position_unknown(),
            default_route: self.ctx.config.default_route,
            cache_fill: self.cache.fill.is_some(),
        });
        if let Some(reason) = routing.pin {
            tracing::debug!(target: "fulcrum_pin", reason, "client pinned to its server connection");
        }
        if let (Decision::Pin(reason), Some(_)) = (decision, self.engine.pinned()) {
            // Pinned already: the state is recorded all the same.
            self.pin(reason);
        }
        self.engine.routed(&routing);
        self.unit_routing = routing;
        if let Some(m) = self.digests.mirror.as_mut() {
            // What the statement is, not where it goes (a read inside a
            // transaction goes to the primary). `route_query` looks at each
            // statement of a text too.
            m.unit_writes(!fulcrum_cluster::mirror::reads_only_takes(decision));
        }
        if self.server.is_some() {
            // Hold: the held connection goes back at once (`act_now`).
            let actions = self.engine.step(Event::Unit(routing));
            let carried = self.carry_out_now(actions);
            debug_assert_eq!(carried, Carried::Done, "a unit answers nothing");
        }
        routing
    }

    /// Where a COM_QUERY goes, and what it changes in the session; its
    /// hint and whether it may commit are noted, all from one
    /// classification (a cache hit reads the text only to look it up).
    /// The statement's fingerprint comes back for its digest.
    /// The effects of a query whose text was not UTF-8 (routed from its
    /// `statement_text`): a setting or schema it would track pins instead,
    /// as its replayed text would not be the client's bytes, and the text
    /// is never rewritten.
    pub(super) fn not_utf8(&mut self, effects: &mut Effects) {
        if effects.set.take().is_some() | effects.schema.take().is_some() {
            self.pin("a setting whose text is not UTF-8");
        }
        effects.own_id = false;
    }

    pub(super) fn route_query(&mut self, text: &str) -> (Routing, Effects, u64) {
        let mut effects = Effects::default();
        let (decision, unit) = self.ctx.classify_unit_for(
            text,
            &self.user,
            (self.hello.wire_format.bits(), self.hello.charset),
            self.schema.as_deref().unwrap_or(""),
        );
        if unit.comments {
            self.reads.note_hint(text.as_bytes());
        } else {
            self.reads.clear_hint();
        }
        self.engine.sending(unit.may_commit);
        // USE classifies as a setting (or, unparsed, not as a read or a
        // write): plain reads and writes skip the look at the first word.
        let first = match decision {
            Decision::Read | Decision::Primary | Decision::Write => "",
            _ => text
                .trim_start()
                .split(|c: char| c.is_whitespace() || c == ';')
                .next()
                .unwrap_or(""),
        };
        if first.eq_ignore_ascii_case("use") {
            let name = text.trim_start()[first.len()..]
                .trim()
                .trim_end_matches(';')
                .trim()
                .trim_matches('`');
            effects.schema = Some(name.to_owned());
        } else if decision == Decision::Set {
            if self.desired.len() >= MAX_SETS {
                self.pin("many session settings");
            } else if crate::codec::statements::second_statement(text.as_bytes()).is_some()
                && !self.only_settings(text)
            {
                // A setting sent with other statements: replaying the text
                // would run them again; the client keeps its connection.
                self.pin("session settings mixed with other statements");
            } else {
                effects.set = Some(text.trim().trim_end_matches(';').to_owned());
            }
        }
        // Connection ids are the ones Fulcrum gave (`identity.rs`).
        effects.thread_ids = unit.identity.processlist;
        effects.own_id = unit.identity.connection_id && !unit.identity.processlist;
        // FOUND_ROWS() must run where SQL_CALC_FOUND_ROWS did: keep the
        // connection for the next command (a fact of the classification,
        // read from identifiers when the text was first seen).
        effects.keep_next = unit.identity.found_rows;
        let routing = self.route_unit(decision);
        // The result cache: what it may change goes now, and again at its
        // answer.
        self.cache_unit_writes(decision, &unit);
        self.cache_txn_sent(decision, text);
        if self.digests.mirror.is_some() {
            let (user, format) = (
                &self.user,
                (self.hello.wire_format.bits(), self.hello.charset),
            );
            let schema = self.schema.as_deref().unwrap_or("");
            let writes = fulcrum_cluster::mirror::unit_may_write(decision, text, |s| {
                self.ctx.classify_unit_for(s, user, format, schema).0
            });
            if let Some(m) = self.digests.mirror.as_mut() {
                m.unit_writes(writes);
            }
        }
        (routing, effects, unit.key)
    }
}

/// Whether `text` contains `needle`, ASCII case ignored.
pub(super) fn contains_ignore_case(text: &str, needle: &str) -> bool {
    text.len() >= needle.len()
        && text
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::contains_ignore_case;

    #[test]
    fn needles_are_found_in_any_case() {
        assert!(contains_ignore_case(
            "LOAD DATA LOCAL INFILE 'x' INTO TABLE t",
            "local infile"
        ));
        assert!(!contains_ignore_case("SELECT 1", "local infile"));
    }
}
