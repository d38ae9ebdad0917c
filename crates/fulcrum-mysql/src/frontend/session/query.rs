//! The two commands that carry a name or SQL text for the server:
//! COM_INIT_DB (a schema, renamed by `[[cluster.database]]`) and COM_QUERY
//! (a statement Fulcrum answers itself, or routes and forwards).

use super::*;

impl Session {
    /// COM_INIT_DB: the schema asked for, sent by its server name (an alias
    /// of `[[cluster.database]]`) or answered here when it is not listed.
    pub(super) async fn init_db(
        &mut self,
        first: &[u8],
        msg: &[u8],
        seq: u8,
    ) -> Result<(), SessionError> {
        let asked = init_db_schema(first).map(|s| String::from_utf8_lossy(s).into_owned());
        // `[[cluster.database]]`: an alias is sent by its server
        // name; one not listed is answered here, as the server would.
        let schema = match &asked {
            Some(name) => match self.ctx.config.server_database(name) {
                Some(server) => Some(server.to_owned()),
                None => {
                    put_error(
                        &mut self.client.write_buf,
                        seq,
                        codes::BAD_DB,
                        &format!("Unknown database '{name}'"),
                    );
                    return Ok(());
                }
            },
            None => None,
        };
        let renamed = match (&asked, &schema) {
            (Some(a), Some(s)) if a != s => {
                let mut packet = BytesMut::new();
                // The client's own sequence id for the command.
                write_packet(
                    &mut packet,
                    msg[3],
                    &crate::codec::command::build_command(Command::InitDb, s.as_bytes()),
                );
                Some(packet)
            }
            _ => None,
        };
        let effects = Effects {
            schema,
            ..Default::default()
        };
        let routing = self.route_unit(Decision::Primary);
        self.forward(
            renamed.as_deref().unwrap_or(msg),
            seq,
            Shape::Results,
            routing,
            effects,
        )
        .await?;
        Ok(())
    }

    /// COM_QUERY: answered by Fulcrum (KILL, CONNECTION_ID(), a setting,
    /// the commit position, a second statement refused), or routed and
    /// forwarded; DDL makes the known functions be forgotten.
    // A function returning its future, not an `async fn`: an `async fn`
    // keeps its arguments twice in its state (as passed and as moved in),
    // bytes every idle client's task carries (issue 44).
    #[allow(clippy::manual_async_fn)] // on purpose: the note above
    pub(super) fn query<'a>(
        &'a mut self,
        first: &'a [u8],
        msg: &'a [u8],
        seq: u8,
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + 'a {
        async move {
            // Text that is not UTF-8 (a latin1 client's literal) is read as
            // `statement_text` gives it, which keeps the statement's shape.
            let text = fulcrum_sql::encoding::statement_text(query_text(first).unwrap_or_default());
            let utf8 = matches!(text, std::borrow::Cow::Borrowed(_));
            let text: &str = &text;
            // The first word, found once, tells which of Fulcrum's own answers
            // may be for it (each also checks it): most statements try none.
            let word = text.split_whitespace().next().unwrap_or("");
            let is = |w: &str| word.eq_ignore_ascii_case(w);
            if is("kill") {
                if let Some(target) = kill_target(text) {
                    self.kill(target, seq).await?;
                    return Ok(());
                }
            }
            if is("select") && self.try_answer_connection_id(text, seq) {
                return Ok(());
            }
            if (is("set") || is("reset") || is("show"))
                && (self.try_answer_setting(text, seq) || self.try_answer_cache_setting(text, seq))
            {
                return Ok(());
            }
            if (is("select") || is("set")) && self.try_answer_position(text, seq).await {
                return Ok(());
            }
            // The bytes as sent: a text that is not UTF-8 is checked too.
            if self.refuse_second_statement(query_text(first).unwrap_or_default(), seq) {
                return Ok(());
            }
            // The result cache: a hit is the answer; a miss it may keep is
            // routed to the primary (`cache_fill`) and captured as it passes.
            // Never with replaced bytes: two texts would share an entry.
            let cached = self.cache_front(if utf8 { text } else { "" }, seq).await;
            if let cache::CacheStep::Answered = cached {
                return Ok(());
            }
            let (routing, mut effects, key) = self.route_query(text);
            if !utf8 {
                self.not_utf8(&mut effects);
            }
            let now = self.engine.now();
            self.digests.pending =
                self.ctx
                    .digest_entry_of(key, text.as_bytes(), now, &mut self.digests.last);
            // `CONNECTION_ID()` within a statement: the client's id.
            let own_id = effects.own_id.then(|| self.with_own_id(text, msg[3]));
            let sent = own_id.as_deref().unwrap_or(msg);
            let forwarded = self
                .forward(sent, seq, Shape::Results, routing, effects)
                .await;
            // Not answered (no server could be had): nothing to keep.
            self.cache_spoil();
            forwarded?;
            // DDL is never a plain read.
            if routing.may_write && (is("create") || is("alter") || is("drop") || is("rename")) {
                // A function may have been created or changed.
                self.ctx.functions.forget();
                // A table, view, trigger or key may have come or gone (MySQL's
                // DDL commits at once: it is seen by all now).
                self.ctx.relations.forget();
            }
            Ok(())
        }
    }
}
