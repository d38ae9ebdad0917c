//! Answers Fulcrum gives without a server: the deferred transaction
//! control of `fulcrum_session::txn`, the DEALLOCATE of a mapped
//! statement, and a transaction lost with its server.

use super::*;

impl Session {
    /// Answers a frame of a client whose transaction died with its server;
    /// false when the frame is for normal processing.
    pub(super) fn answer_lost(&mut self, tag: u8, total: usize) -> bool {
        if !self.engine.is_lost() {
            return false;
        }
        let lost = &mut self.lost;
        let ctx = &self.ctx;
        let ends =
            |text: &[u8]| std::str::from_utf8(text).is_ok_and(|t| ctx.classify(t) == Decision::End);
        match lost.answer(
            tag,
            &self.client.read_buf[5..total],
            &ends,
            &mut self.client.write_buf,
        ) {
            lost::Answer::Pass => {
                let actions = self.engine.step(Event::LostEnded);
                self.carry_out_now(actions);
                false
            }
            lost::Answer::Held => {
                if tag == b'Q' || tag == b'S' || tag == b'F' {
                    self.set_status(b'E');
                }
                let _ = self.client.read_buf.split_to(total);
                true
            }
            lost::Answer::Done => {
                let actions = self.engine.step(Event::LostEnded);
                self.carry_out_now(actions);
                self.set_status(b'I');
                let _ = self.client.read_buf.split_to(total);
                true
            }
        }
    }

    /// A lone `BEGIN`/`START TRANSACTION`, then `SET TRANSACTION ...`, or the
    /// `COMMIT`/`ROLLBACK` of a transaction with no statement yet, is answered
    /// by Fulcrum without a server: the first real statement picks the server
    /// (a replica for a read-only transaction) and the BEGIN travels with it.
    /// Statement pooling defers nothing: a BEGIN goes to the server, whose
    /// answer ends the client there (`statement_mode.rs`), as in PgBouncer.
    pub(super) fn try_defer_transaction_control(&mut self, total: usize) -> bool {
        if !self.stmts.rewrite
            || self.pool_mode == PoolMode::Statement
            || self.engine.pinned().is_some()
            || self.engine.status() == Status::Failed
        {
            return false;
        }
        let Some(text) = query_text(&self.client.read_buf[5..total]) else {
            return false;
        };
        // Cheap test first: only transaction control can be deferred.
        let first = first_word(text);
        if !txn::candidate(first, self.engine.deferred().is_some()) {
            return false;
        }
        let Ok(text) = std::str::from_utf8(text) else {
            return false;
        };
        if !is_single_statement(text) {
            return false;
        }
        let decision = self.ctx.classify(text);
        let (answer, actions) = self.engine.defer(decision, text);
        // A pending drain's close waits for the boundary check.
        self.carry_out_now(actions);
        let (tag, status) = match answer {
            Some(Deferral::Opened(_)) => ("BEGIN", b'T'),
            Some(Deferral::Changed) => ("SET", b'T'),
            Some(Deferral::Chained(tag)) => (tag, b'T'),
            Some(Deferral::Ended(tag)) => (tag, b'I'),
            None => return false,
        };
        backend_msg::command_complete(&mut self.client.write_buf, tag);
        backend_msg::ready_for_query(&mut self.client.write_buf, status);
        self.set_status(status);
        true
    }

    /// `DEALLOCATE name` of a statement Fulcrum mapped is answered here: the
    /// shared server-side statement stays for other clients.
    pub(super) fn try_answer_deallocate(&mut self, body: &[u8]) -> bool {
        if !self.stmts.rewrite {
            return false;
        }
        let Some(effects) = deallocate_ops(&self.ctx, body) else {
            return false;
        };
        let mut effects = effects.iter();
        let (Some(Effect::Deallocate(target)), None) = (effects.next(), effects.next()) else {
            return false;
        };
        let tag = match target {
            Some(name) => {
                if self.stmts.map.remove(name.as_bytes()).is_none() {
                    return false;
                }
                "DEALLOCATE"
            }
            None => {
                if self.engine.pinned().is_some() {
                    return false; // SQL-level statements may exist on the server too.
                }
                self.stmts.map.clear();
                "DEALLOCATE ALL"
            }
        };
        self.owed.expect.push(Expect::SyntheticQuery(tag));
        if self.server.is_none() {
            self.owed.expect.drain_synthetic(
                &mut self.client.write_buf,
                status_byte(self.engine.status()),
            );
        }
        true
    }

    /// `try_answer_deallocate` for the Query at the front of the client
    /// buffer (`total` bytes), before any server is attached.
    pub(super) fn try_answer_local_deallocate(&mut self, total: usize) -> bool {
        if !self.stmts.rewrite
            || deallocate_ops(&self.ctx, &self.client.read_buf[5..total]).is_none()
        {
            return false;
        }
        let body = self.client.read_buf[5..total].to_vec();
        self.try_answer_deallocate(&body)
    }
}
