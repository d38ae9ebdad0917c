//! A cluster's Unix-domain socket listener: where the socket is
//! (PostgreSQL's `unix_socket_dir`, where `.s.PGSQL.<port>` goes, or
//! MySQL's `unix_socket` file), its permissions and its group.

use std::path::{Path, PathBuf};

/// PgBouncer's default `unix_socket_mode`.
pub const DEFAULT_MODE: u32 = 0o777;

/// The longest path a Unix socket can be bound at (`sun_path` holds 108
/// bytes with the terminating NUL).
pub const MAX_PATH_BYTES: usize = 107;

/// Where, and with which permissions, a cluster also listens on a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixSocket {
    pub place: UnixPlace,
    /// The socket file's permission bits (`unix_socket_mode`).
    pub mode: u32,
    /// The group the socket file is given (`unix_socket_group`), if any.
    pub group: Option<UnixGroup>,
}

/// The socket's place, as each protocol's clients look for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnixPlace {
    /// PostgreSQL: a directory; the socket is `.s.PGSQL.<port>` in it, so
    /// `psql -h DIR -p PORT` finds it.
    Dir(PathBuf),
    /// MySQL: the socket file itself (`mysql -S PATH`).
    File(PathBuf),
}

/// A group by name, with the id it had when the config was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixGroup {
    pub name: String,
    pub gid: u32,
}

impl UnixSocket {
    /// The socket file for a listener on TCP port `port` (the port the
    /// listener was bound to, when `listen` asks for port 0).
    pub fn path(&self, port: u16) -> PathBuf {
        match &self.place {
            UnixPlace::Dir(dir) => pg_socket_path(dir, port),
            UnixPlace::File(path) => path.clone(),
        }
    }
}

/// `<dir>/.s.PGSQL.<port>`: where libpq looks for a server's socket.
pub fn pg_socket_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}
