//! The login roles and database every test cluster gets, one role per client
//! authentication method, so proxy tests can exercise each of them. The
//! `pg_hba.conf` that routes each role to its method lives in `pg_conf.rs`.

/// Superuser; trusted over the unix socket and from 127.0.0.1.
pub const SUPERUSER: &str = "postgres";
/// Database created on every cluster, owned by [`APP_USER`].
pub const APP_DB: &str = "app";
/// Authenticates with SCRAM-SHA-256 (password stored as SCRAM). Owns [`APP_DB`].
pub const APP_USER: &str = "app";
/// Authenticates with MD5 (password stored as MD5, or the server would upgrade
/// the exchange to SCRAM).
pub const APP_MD5_USER: &str = "app_md5";
/// Authenticates with a cleartext password (`password` method).
pub const APP_PLAIN_USER: &str = "app_plain";
/// Trusted: no password asked (one is set all the same).
pub const APP_TRUST_USER: &str = "app_trust";
/// Password of every `app*` role.
pub const APP_PASSWORD: &str = "secret";

/// Creates the roles and the database. Fed to psql on stdin, one statement at a
/// time, because `CREATE DATABASE` cannot run inside the implicit transaction
/// of a multi-statement `-c`.
///
/// The other roles are members of `app`, so they can read and write what
/// `app` owns (e.g. the pgbench tables) and create tables in `public`, whose
/// owner in PostgreSQL 15 is the database owner. Run `pgbench -i` as `app` if
/// other roles will use the tables: a role cannot drop another's tables.
/// Tables the superuser creates in `app` (e.g. through `PgNode::sql`) are
/// granted to `app` by default privileges, so tests can set up as superuser
/// and query as any `app*` role.
pub(crate) fn bootstrap_sql() -> String {
    format!(
        "SET password_encryption = 'scram-sha-256';\n\
         CREATE ROLE {APP_USER} LOGIN PASSWORD '{APP_PASSWORD}';\n\
         CREATE ROLE {APP_PLAIN_USER} LOGIN PASSWORD '{APP_PASSWORD}';\n\
         CREATE ROLE {APP_TRUST_USER} LOGIN PASSWORD '{APP_PASSWORD}';\n\
         SET password_encryption = 'md5';\n\
         CREATE ROLE {APP_MD5_USER} LOGIN PASSWORD '{APP_PASSWORD}';\n\
         RESET password_encryption;\n\
         CREATE DATABASE {APP_DB} OWNER {APP_USER};\n\
         GRANT {APP_USER} TO {APP_MD5_USER}, {APP_PLAIN_USER}, {APP_TRUST_USER};\n\
         \\connect {APP_DB}\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {SUPERUSER} IN SCHEMA public \
           GRANT ALL ON TABLES TO {APP_USER};\n\
         ALTER DEFAULT PRIVILEGES FOR ROLE {SUPERUSER} IN SCHEMA public \
           GRANT ALL ON SEQUENCES TO {APP_USER};\n"
    )
}
