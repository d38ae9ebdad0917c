//! Commands the session answers with care of its own: COM_CHANGE_USER (the
//! session starts afresh as the new user) and COM_RESET_CONNECTION.

use super::*;

impl Session {
    /// COM_CHANGE_USER: the new user's password is checked against the
    /// login's scramble; the session then starts afresh as that user (no
    /// settings, statements or pins; its server connection goes back).
    pub(super) async fn change_user(
        &mut self,
        payload: &[u8],
        seq: u8,
    ) -> Result<(), SessionError> {
        let c = match crate::codec::change_user::parse_change_user(payload, self.hello.caps) {
            Ok(c) => c,
            Err(e) => {
                put_error(
                    &mut self.client.write_buf,
                    seq,
                    codes::HANDSHAKE,
                    &format!("fulcrum: bad COM_CHANGE_USER: {e}"),
                );
                return Ok(());
            }
        };
        let plugin = c
            .auth_plugin
            .as_deref()
            .unwrap_or(crate::auth::native::PLUGIN);
        let password = self.ctx.passwords.get(&c.user).cloned();
        let trust = self.ctx.config.client_auth == fulcrum_config::ClientAuth::Trust;
        let ok = password.as_ref().is_some_and(|p| {
            trust
                || crate::frontend::login::password_ok(
                    plugin,
                    p,
                    &self.hello.scramble,
                    &c.auth_response,
                )
        });
        if !ok {
            let m = format!(
                "Access denied for user '{}' (using password: {})",
                c.user,
                if c.auth_response.is_empty() {
                    "NO"
                } else {
                    "YES"
                }
            );
            put_error(&mut self.client.write_buf, seq, codes::ACCESS_DENIED, &m);
            // MySQL closes the connection after a failed change of user.
            let _ = self.flush().await;
            return Err(SessionError::Refused(m));
        }
        // Forget everything of the old user; a clean connection goes back.
        self.engine.drop_keep();
        self.cleanup().await;
        // A new engine for the new user; the transaction log (its
        // `transaction_replay` limits) carries over.
        let log = self.engine.take_txn_log();
        self.engine = Engine::new(None).with_txn_log(log).with_may_write(false);
        self.desired.clear();
        self.cache.off = false;
        self.cache.txn.reset();
        self.prepared.map.clear();
        self.prepared.last = None;
        self.set_status(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        self.user = c.user.as_str().into();
        let id = self.hello.connection_id;
        let entry = self.client_entry.clone_entry();
        self.running = Some(self.ctx.register_client(id, self.user.clone(), entry));
        // Another user's (or character set's) pools from now on.
        self.pool = None;
        if let Some(cs) = c.charset {
            self.hello.charset = cs;
        }
        self.schema = None;
        if let Some(asked) = c.schema {
            // `[[cluster.database]]`, as at login and COM_INIT_DB: an alias
            // goes by its server name, an unlisted schema is refused.
            let Some(schema) = self.ctx.config.server_database(&asked).map(str::to_owned) else {
                let m = format!("Unknown database '{asked}'");
                put_error(&mut self.client.write_buf, seq, codes::BAD_DB, &m);
                let _ = self.flush().await;
                return Err(SessionError::Refused(m));
            };
            self.schema = Some(schema.clone());
            self.check_schema(&schema, seq).await?;
        }
        if self.ctx.config.pool_mode_of(&self.user) == fulcrum_config::PoolMode::Session {
            self.pin(fulcrum_session::SESSION_POOL);
        }
        put_ok(
            &mut self.client.write_buf,
            seq,
            self.hello.caps,
            self.status,
        );
        Ok(())
    }

    /// COM_RESET_CONNECTION: the client's session state is forgotten; a
    /// pinned connection is reset on the server too and unpinned.
    pub(super) async fn reset_connection(&mut self, seq: u8) -> Result<(), SessionError> {
        self.desired.clear();
        self.cache.off = false;
        self.cache.txn.reset();
        self.engine.drop_keep();
        if let Some(server) = self.server.as_mut() {
            match server.reset().await {
                Ok(()) => {}
                Err(e) => return Err(self.lost(seq, &e.to_string()).await),
            }
        }
        self.set_status(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        put_ok(
            &mut self.client.write_buf,
            seq,
            self.hello.caps,
            self.status,
        );
        // The pinned state is gone with the reset: the engine lifts the pin
        // and detaches; otherwise the connection goes back as after any
        // command.
        let actions = self.engine.step(Event::Reset);
        let carried = self.carry_out_now(actions);
        debug_assert_eq!(carried, Carried::Done, "Reset answers nothing");
        self.maybe_detach();
        Ok(())
    }
}
