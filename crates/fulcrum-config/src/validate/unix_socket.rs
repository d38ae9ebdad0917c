//! A cluster's Unix-socket listener keys: `unix_socket_dir` (PostgreSQL),
//! `unix_socket` (MySQL), `unix_socket_mode` and `unix_socket_group`.
//! Paths are relative to the config file's directory, like every other
//! path in it; the directory itself is checked when Fulcrum binds (a
//! runtime directory may not exist when the file is checked).

use std::path::Path;

use super::table::Table;
use crate::error::{Lines, Problem};
use crate::raw::RawCluster;
use crate::types::unix_socket::{DEFAULT_MODE, MAX_PATH_BYTES};
use crate::types::{
    pg_socket_path, ClientAuth, Cluster, Protocol, UnixGroup, UnixPlace, UnixSocket,
};

pub(super) fn unix_socket(
    t: &Table,
    c: &RawCluster,
    protocol: Protocol,
    port: u16,
    client_auth: ClientAuth,
    base: &Path,
) -> Result<Option<UnixSocket>, Problem> {
    let place = match protocol {
        Protocol::Postgres => {
            if let Some(v) = &c.unix_socket {
                return Err(t.error(
                    v,
                    "unix_socket",
                    "MySQL only: a PostgreSQL cluster names a directory with unix_socket_dir \
                     (its socket is .s.PGSQL.<port> there, where psql -h DIR looks)",
                ));
            }
            match &c.unix_socket_dir {
                None => None,
                Some(v) => {
                    let dir = base.join(t.text(&c.unix_socket_dir, "unix_socket_dir", None)?);
                    // The longest name a port can give (port 0: the OS picks one).
                    let longest = pg_socket_path(&dir, if port == 0 { 65535 } else { port });
                    fits(t, v, "unix_socket_dir", &longest)?;
                    Some(UnixPlace::Dir(dir))
                }
            }
        }
        Protocol::Mysql => {
            if let Some(v) = &c.unix_socket_dir {
                return Err(t.error(
                    v,
                    "unix_socket_dir",
                    "PostgreSQL only: a MySQL cluster names its socket file with unix_socket",
                ));
            }
            match &c.unix_socket {
                None => None,
                Some(v) => {
                    let path = base.join(t.text(&c.unix_socket, "unix_socket", None)?);
                    fits(t, v, "unix_socket", &path)?;
                    Some(UnixPlace::File(path))
                }
            }
        }
    };
    let mode = match &c.unix_socket_mode {
        None => DEFAULT_MODE,
        Some(v) => parse_mode(v.get_ref()).map_err(|why| t.error(v, "unix_socket_mode", why))?,
    };
    let group = match &c.unix_socket_group {
        None => None,
        Some(v) => {
            let name = t.text(&c.unix_socket_group, "unix_socket_group", None)?;
            let gid = group_id(&name).ok_or_else(|| {
                t.error(
                    v,
                    "unix_socket_group",
                    format!(
                        "no group {name:?} in /etc/group (a numeric group id is taken as it is)"
                    ),
                )
            })?;
            Some(UnixGroup { name, gid })
        }
    };
    let Some(place) = place else {
        let set = [
            (
                "unix_socket_mode",
                c.unix_socket_mode.as_ref().map(|v| v.span()),
            ),
            (
                "unix_socket_group",
                c.unix_socket_group.as_ref().map(|v| v.span()),
            ),
        ];
        if let Some((name, Some(span))) = set.into_iter().find(|(_, s)| s.is_some()) {
            let wants = match protocol {
                Protocol::Postgres => "unix_socket_dir",
                Protocol::Mysql => "unix_socket",
            };
            return Err(Problem::new(
                t.line(&span),
                t.key(name),
                format!("has no socket to apply to: set {wants} too"),
            ));
        }
        return Ok(None);
    };
    if client_auth == ClientAuth::Cert {
        let (name, v) = raw_place(c).expect("a place was given");
        return Err(t.error(
            v,
            name,
            "client_auth = \"cert\" needs TLS, which a Unix socket does not offer: no client could log in there",
        ));
    }
    Ok(Some(UnixSocket { place, mode, group }))
}

/// The key that set the socket's place, with its value.
pub(super) fn raw_place(c: &RawCluster) -> Option<(&'static str, &toml::Spanned<String>)> {
    match (&c.unix_socket_dir, &c.unix_socket) {
        (Some(v), _) => Some(("unix_socket_dir", v)),
        (None, Some(v)) => Some(("unix_socket", v)),
        (None, None) => None,
    }
}

/// No two listeners bind one socket path (clusters sharing a listener
/// share its socket: `shared_port` checks they agree). A PostgreSQL
/// listener on port 0 gets its port, and so its path, at start.
pub(super) fn distinct(
    raw: &[toml::Spanned<RawCluster>],
    clusters: &[Cluster],
    lines: &Lines,
) -> Result<(), Problem> {
    let mut seen: Vec<(std::path::PathBuf, usize, usize)> = Vec::new();
    for (i, (raw, cluster)) in raw.iter().zip(clusters).enumerate() {
        let Some(socket) = &cluster.unix_socket else {
            continue;
        };
        let port = cluster.listen.port();
        if port == 0 && matches!(socket.place, UnixPlace::Dir(_)) {
            continue;
        }
        let shares = clusters[..i]
            .iter()
            .any(|c| port != 0 && c.listen == cluster.listen);
        if shares {
            continue;
        }
        let path = socket.path(port);
        let (name, v) = raw_place(raw.get_ref()).expect("a socket has its key");
        let line = lines.line(v.span().start);
        if let Some((_, j, first)) = seen.iter().find(|(p, _, _)| *p == path) {
            return Err(Problem::new(
                line,
                format!("cluster[{i}].{name}"),
                format!(
                    "the socket {} is already cluster[{j}]'s (line {first})",
                    path.display()
                ),
            ));
        }
        seen.push((path, i, line));
    }
    Ok(())
}

/// A socket path must fit in `sun_path`.
fn fits<T>(t: &Table, v: &toml::Spanned<T>, name: &str, path: &Path) -> Result<(), Problem> {
    let len = path.as_os_str().len();
    if len > MAX_PATH_BYTES {
        return Err(t.error(
            v,
            name,
            format!(
                "the socket path {} is {len} bytes; a Unix socket path is at most {MAX_PATH_BYTES}",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// `unix_socket_mode`: permission bits in octal, as chmod takes them
/// ("0777", "660"); no setuid, setgid or sticky bit (they mean nothing on a
/// socket).
pub(crate) fn parse_mode(text: &str) -> Result<u32, String> {
    let ok =
        !text.is_empty() && text.len() <= 4 && text.bytes().all(|b| (b'0'..=b'7').contains(&b));
    let mode = ok.then(|| u32::from_str_radix(text, 8).ok()).flatten();
    match mode {
        Some(m) if m <= 0o777 => Ok(m),
        _ => Err(format!(
            "{text:?} is not a file mode: octal permission bits such as \"0777\" (the default) or \"0660\""
        )),
    }
}

/// A group's id: the name looked up in /etc/group, or a number as it is.
fn group_id(name: &str) -> Option<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Some(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::{group_id, parse_mode};

    #[test]
    fn modes_are_octal_permission_bits() {
        for (text, mode) in [
            ("0777", 0o777),
            ("777", 0o777),
            ("0660", 0o660),
            ("0", 0),
            ("0700", 0o700),
        ] {
            assert_eq!(parse_mode(text), Ok(mode), "{text}");
        }
        for bad in [
            "",
            "0o777",
            "0999",
            "rw-rw----",
            "1777",
            "4755",
            "07777",
            "00777",
            " 777",
            "-1",
        ] {
            assert!(parse_mode(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn groups_are_found_by_name_or_number() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("4242"), Some(4242));
        assert_eq!(group_id("no-such-group-here"), None);
    }
}
