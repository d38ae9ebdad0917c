//! TLS between Fulcrum and PostgreSQL servers, and the TLS logins only a
//! certificate or channel binding can give: a real daemon in front of a
//! TLS-only PostgreSQL (`ssl = on`, `hostssl` lines only in pg_hba.conf).
//! psql with `sslmode=verify-full` and `channel_binding=require` end to
//! end; `server_tls` from `disable` to `verify-full`, a wrong CA and an
//! expired server certificate; `server_channel_binding = "require"`;
//! client certificates (`client_auth = "cert"`); pgbench with
//! `sslmode=require` in every protocol mode; and handshakes that are
//! garbage or stop half-way. Certificates are made at test time.
//!
//! Split by theme: `end_to_end` (psql and pgbench over TLS, `server_tls`
//! modes, bad certificates, client certificates, bad handshakes) and
//! `upstream` (tokio-postgres over rustls, Fulcrum's own client certificate,
//! reloads and mirror lanes); the shared certificates and cluster in
//! `helpers`.

mod end_to_end;
mod helpers;
mod upstream;
