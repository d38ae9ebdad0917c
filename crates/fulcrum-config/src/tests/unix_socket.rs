//! The Unix-socket listener keys: `unix_socket_dir` (PostgreSQL),
//! `unix_socket` (MySQL), `unix_socket_mode`, `unix_socket_group`; their
//! values, and the rules across clusters.

use std::path::Path;

use super::{assert_errors, dedent, MINIMAL};
use crate::{UnixGroup, UnixPlace, UnixSocket};

/// `MINIMAL` with `lines` after `listen` (the first on line 5), of `protocol`.
fn with(protocol: &str, lines: &[&str]) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    let keys: String = lines.iter().map(|l| format!("    {l}\n")).collect();
    MINIMAL
        .replace(
            "protocol = \"postgres\"",
            &format!("protocol = \"{protocol}\""),
        )
        .replace(listen, &format!("{listen}{keys}"))
}

#[test]
fn bad_socket_values_are_config_errors() {
    let long = format!("unix_socket_dir = \"/{}\"", "d".repeat(100));
    let not_a_mode = |v: &str| {
        format!(
            "fulcrum.toml:5: cluster[0].unix_socket_mode: \"{v}\" is not a file mode: octal permission bits \
             such as \"0777\" (the default) or \"0660\""
        )
    };
    let mode = |v: &str| format!("unix_socket_mode = \"{v}\"");
    let cases = [
        (with("postgres", &[&mode("0999")]), not_a_mode("0999")),
        (with("postgres", &[&mode("rw-rw-rw-")]), not_a_mode("rw-rw-rw-")),
        (with("postgres", &[&mode("")]), not_a_mode("")),
        (with("postgres", &[&mode("1777")]), not_a_mode("1777")),
        (with("postgres", &[&mode("0o777")]), not_a_mode("0o777")),
        (
            with("postgres", &["unix_socket_mode = 777"]),
            "fulcrum.toml:5: cluster[0].unix_socket_mode: invalid type: integer `777`, expected a string".into(),
        ),
        (
            with("postgres", &[&mode("0660")]),
            "fulcrum.toml:5: cluster[0].unix_socket_mode: has no socket to apply to: set unix_socket_dir too".into(),
        ),
        (
            with("mysql", &["unix_socket_group = \"root\""]),
            "fulcrum.toml:5: cluster[0].unix_socket_group: has no socket to apply to: set unix_socket too".into(),
        ),
        (
            with("postgres", &["unix_socket_dir = \"/run\"", "unix_socket_group = \"no-such-group-here\""]),
            "fulcrum.toml:6: cluster[0].unix_socket_group: no group \"no-such-group-here\" in /etc/group \
             (a numeric group id is taken as it is)".into(),
        ),
        (
            with("postgres", &["unix_socket_dir = \" \""]),
            "fulcrum.toml:5: cluster[0].unix_socket_dir: must not be empty".into(),
        ),
        (
            with("postgres", &[&long]),
            format!(
                "fulcrum.toml:5: cluster[0].unix_socket_dir: the socket path /{}/.s.PGSQL.6432 is 115 bytes; \
                 a Unix socket path is at most 107",
                "d".repeat(100)
            ),
        ),
        (
            with("postgres", &["unix_socket = \"/run/fulcrum.sock\""]),
            "fulcrum.toml:5: cluster[0].unix_socket: MySQL only: a PostgreSQL cluster names a directory with \
             unix_socket_dir (its socket is .s.PGSQL.<port> there, where psql -h DIR looks)".into(),
        ),
        (
            with("mysql", &["unix_socket_dir = \"/run\""]),
            "fulcrum.toml:5: cluster[0].unix_socket_dir: PostgreSQL only: a MySQL cluster names its socket file \
             with unix_socket".into(),
        ),
        (
            with("postgres", &["unix_socket_dir = \"/run\"", "client_auth = \"cert\""]),
            "fulcrum.toml:5: cluster[0].unix_socket_dir: client_auth = \"cert\" needs TLS, which a Unix socket \
             does not offer: no client could log in there".into(),
        ),
    ];
    let cases: Vec<(&str, &str)> = cases
        .iter()
        .map(|(t, w)| (t.as_str(), w.as_str()))
        .collect();
    assert_errors(&cases);
}

#[test]
fn two_listeners_never_bind_one_socket() {
    let one = with("mysql", &["unix_socket = \"/run/my.sock\""]);
    let other = one
        .replace("name = \"main\"", "name = \"other\"")
        .replace("127.0.0.1:6432", "127.0.0.1:6433");
    // The same port: one listener, which has one socket.
    let shared = with("postgres", &["unix_socket_dir = \"/run\""]).replace(
        "[[cluster.user]]",
        "[[cluster.database]]\n    name = \"app\"\n    [[cluster.user]]",
    );
    let shared_other = MINIMAL
        .replace("name = \"main\"", "name = \"other\"")
        .replace("127.0.0.1:5432", "127.0.0.1:5433");
    assert_errors(&[
        (
            &format!("{one}{}", other.trim_start_matches('\n')),
            "fulcrum.toml:16: cluster[1].unix_socket: the socket /run/my.sock is already cluster[0]'s (line 5)",
        ),
        (
            &format!("{shared}{}", shared_other.trim_start_matches('\n')),
            "fulcrum.toml:17: cluster[1].listen: 127.0.0.1:6432 is shared with cluster \"main\", whose Unix socket \
             (unix_socket_dir or unix_socket, its mode and group) differs: clusters on one port share its socket, \
             so they must have the same",
        ),
    ]);
}

#[test]
fn socket_paths_are_read_relative_to_the_config_file() {
    let text = dedent(&with(
        "postgres",
        &[
            "unix_socket_dir = \"run\"",
            "unix_socket_mode = \"0660\"",
            "unix_socket_group = \"root\"",
        ],
    ));
    let config = crate::parse(&text, Path::new("/etc/fulcrum/fulcrum.toml")).unwrap();
    let socket = config.clusters[0].unix_socket.clone().expect("a socket");
    assert_eq!(
        socket,
        UnixSocket {
            place: UnixPlace::Dir("/etc/fulcrum/run".into()),
            mode: 0o660,
            group: Some(UnixGroup {
                name: "root".into(),
                gid: 0
            }),
        }
    );
    assert_eq!(
        socket.path(6432),
        Path::new("/etc/fulcrum/run/.s.PGSQL.6432")
    );
    let text = dedent(&with(
        "mysql",
        &["unix_socket = \"/run/mysqld/fulcrum.sock\""],
    ));
    let config = crate::parse(&text, Path::new("fulcrum.toml")).unwrap();
    let socket = config.clusters[0].unix_socket.clone().expect("a socket");
    assert_eq!(socket.mode, 0o777, "PgBouncer's default");
    assert_eq!(socket.path(6432), Path::new("/run/mysqld/fulcrum.sock"));
    let plain = crate::parse(&dedent(MINIMAL), Path::new("fulcrum.toml")).unwrap();
    assert_eq!(plain.clusters[0].unix_socket, None);
}
