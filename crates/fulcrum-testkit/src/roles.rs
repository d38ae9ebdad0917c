//! The login roles and database every test cluster gets. PostgreSQL: one role
//! per client authentication method, so proxy tests can exercise each of them
//! (the `pg_hba.conf` that routes each role to its method lives in
//! `pg_conf.rs`). MariaDB: the same `app` user, database and password, a
//! replication user, and a root without password (see the `MARIA_*` items).

/// PostgreSQL superuser; trusted over the unix socket and from 127.0.0.1.
pub const SUPERUSER: &str = "postgres";
/// Database created on every cluster: on PostgreSQL owned by [`APP_USER`], on
/// MariaDB (utf8mb4) with ALL PRIVILEGES on `app.*` granted to [`APP_USER`].
pub const APP_DB: &str = "app";
/// PostgreSQL: authenticates with SCRAM-SHA-256 (password stored as SCRAM).
/// Owns [`APP_DB`].
///
/// MariaDB: `app`@`%` with `mysql_native_password`, over TCP from 127.0.0.1
/// and over the unix socket alike (no anonymous user shadows it). It holds
/// ALL PRIVILEGES on `app.*` and no global privilege at all: no SUPER, no
/// READ ONLY ADMIN, nothing that writes outside `app`. So a write misrouted
/// to a replica (`read_only=1`) fails with ERROR 1290
/// (ER_OPTION_PREVENTS_STATEMENT) instead of silently succeeding and breaking
/// replication.
pub const APP_USER: &str = "app";
/// Authenticates with MD5 (password stored as MD5, or the server would upgrade
/// the exchange to SCRAM).
pub const APP_MD5_USER: &str = "app_md5";
/// Authenticates with a cleartext password (`password` method).
pub const APP_PLAIN_USER: &str = "app_plain";
/// Trusted: no password asked (one is set all the same).
pub const APP_TRUST_USER: &str = "app_trust";
/// Password of every `app*` role (PostgreSQL) and of `app` (MariaDB).
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

// ---- MariaDB (see also APP_DB, APP_USER and APP_PASSWORD above) ----

/// MariaDB superuser: `root`@`localhost` (unix socket) and `root`@`127.0.0.1`
/// (TCP), no password. It holds SUPER and READ ONLY ADMIN, so it CAN write on
/// a read-only replica: tests must not use it to prove routing.
pub const MARIA_SUPERUSER: &str = "root";
/// MariaDB replication user, `repl`@`%` (`mysql_native_password`), with
/// REPLICATION SLAVE only; the replicas connect to the primary as this user.
pub const MARIA_REPL_USER: &str = "repl";
/// Password of [`MARIA_REPL_USER`] (the same as [`APP_PASSWORD`]).
pub const MARIA_REPL_PASSWORD: &str = APP_PASSWORD;

/// Creates the MariaDB database and users on the primary, fed to the client
/// on stdin. Everything is binlogged, so replicas attached from the same fresh
/// install receive it through replication. Both users authenticate with
/// `mysql_native_password` explicitly (not whatever the server's default is).
///
/// It first drops `root`@`<machine hostname>`, which the installer creates and
/// which `--skip-name-resolve` makes unusable (the server warns about it at
/// every start), as `mariadb-secure-installation` does.
pub(crate) fn maria_bootstrap_sql() -> String {
    format!(
        "DELETE FROM mysql.global_priv WHERE User = '{MARIA_SUPERUSER}' \
           AND Host NOT IN ('localhost', '127.0.0.1', '::1');\n\
         DELETE FROM mysql.proxies_priv WHERE Host NOT IN ('localhost', '127.0.0.1', '::1');\n\
         FLUSH PRIVILEGES;\n\
         CREATE DATABASE {APP_DB} CHARACTER SET utf8mb4;\n\
         CREATE USER '{APP_USER}'@'%' IDENTIFIED VIA mysql_native_password \
           USING PASSWORD('{APP_PASSWORD}');\n\
         GRANT ALL PRIVILEGES ON {APP_DB}.* TO '{APP_USER}'@'%';\n\
         CREATE USER '{MARIA_REPL_USER}'@'%' IDENTIFIED VIA mysql_native_password \
           USING PASSWORD('{MARIA_REPL_PASSWORD}');\n\
         GRANT REPLICATION SLAVE ON *.* TO '{MARIA_REPL_USER}'@'%';\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maria_app_user_gets_database_privileges_only() {
        let sql = maria_bootstrap_sql();
        assert!(
            sql.contains("GRANT ALL PRIVILEGES ON app.* TO 'app'@'%'"),
            "{sql}"
        );
        // No global grant for app: that is what makes read_only bite.
        assert!(!sql.contains("ON *.* TO 'app'"), "{sql}");
        assert!(!sql.to_uppercase().contains("SUPER"), "{sql}");
        assert!(
            sql.contains("GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%'"),
            "{sql}"
        );
    }
}
