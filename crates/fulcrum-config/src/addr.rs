//! Address rules: backend `host:port` strings (hosts may be names, resolved later by the
//! pool) and listen addresses, which must be IP literals and must not overlap.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Checks a backend address: `host:port`, `[ipv6]:port`, or `/socket/dir:port`
/// (a Unix-domain socket, as libpq reads an absolute host); port 1-65535.
pub(crate) fn check_backend_address(s: &str) -> Result<(), String> {
    let invalid = |why: &str| format!("invalid address {s:?}: {why}");
    let port = if s.starts_with('/') {
        let (_, port) = s.rsplit_once(':').ok_or_else(|| {
            invalid("expected /socket/directory:port, e.g. \"/var/run/postgresql:5432\"")
        })?;
        port
    } else if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid("missing ']' after the IPv6 address"))?;
        host.parse::<Ipv6Addr>()
            .map_err(|_| invalid("not a valid IPv6 address inside [...]"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| invalid("expected host:port, e.g. \"[::1]:5432\""))?;
        port
    } else {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| invalid("expected host:port, e.g. \"127.0.0.1:5432\""))?;
        if host.contains(':') {
            return Err(invalid(
                "put an IPv6 address in brackets, e.g. \"[::1]:5432\"",
            ));
        }
        if host.is_empty() {
            return Err(invalid("missing host before ':'"));
        }
        let name_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        if !host.chars().all(name_chars) {
            return Err(invalid("the host must be an IP address or a DNS name"));
        }
        port
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(invalid(&format!(
            "port {port:?} is not a number from 1 to 65535"
        ))),
    }
}

/// Parses a listen address: an IP literal and a port (listeners bind, they do not resolve).
pub(crate) fn parse_listen_address(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("invalid address {s:?}: expected an IP address and port, e.g. \"127.0.0.1:6432\"")
    })
}

/// Whether two listeners would fight over the same port.
///
/// Port 0 (the OS picks a free port, used by tests) never conflicts. An unspecified IPv4
/// address (`0.0.0.0`) takes the port on every IPv4 address; an unspecified IPv6 address
/// (`[::]`) on Linux's default dual-stack sockets takes it on every address of both families.
pub(crate) fn listeners_conflict(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let covers = |wild: IpAddr, other: IpAddr| match wild {
        IpAddr::V4(w) => w.is_unspecified() && other.is_ipv4(),
        IpAddr::V6(w) => w.is_unspecified(),
    };
    a.ip() == b.ip() || covers(a.ip(), b.ip()) || covers(b.ip(), a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_addresses_accept_names_ips_and_bracketed_ipv6() {
        for ok in [
            "127.0.0.1:5432",
            "db-1.internal:5432",
            "localhost:1",
            "[::1]:65535",
            "my_host:3306",
            "/var/run/postgresql:5432",
        ] {
            assert_eq!(check_backend_address(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn backend_addresses_reject_with_a_reason() {
        let cases = [
            (
                "db1",
                r#"invalid address "db1": expected host:port, e.g. "127.0.0.1:5432""#,
            ),
            (
                ":5432",
                r#"invalid address ":5432": missing host before ':'"#,
            ),
            (
                "db:0",
                r#"invalid address "db:0": port "0" is not a number from 1 to 65535"#,
            ),
            (
                "db:70000",
                r#"invalid address "db:70000": port "70000" is not a number from 1 to 65535"#,
            ),
            (
                "db:",
                r#"invalid address "db:": port "" is not a number from 1 to 65535"#,
            ),
            (
                "::1:5432",
                r#"invalid address "::1:5432": put an IPv6 address in brackets, e.g. "[::1]:5432""#,
            ),
            (
                "[::1:5432",
                r#"invalid address "[::1:5432": missing ']' after the IPv6 address"#,
            ),
            (
                "[db]:5432",
                r#"invalid address "[db]:5432": not a valid IPv6 address inside [...]"#,
            ),
            (
                "[::1]",
                r#"invalid address "[::1]": expected host:port, e.g. "[::1]:5432""#,
            ),
            (
                "db 1:5432",
                r#"invalid address "db 1:5432": the host must be an IP address or a DNS name"#,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(check_backend_address(text), Err(want.to_string()), "{text}");
        }
    }

    #[test]
    fn listeners_conflict_on_same_port_and_overlapping_ip() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let cases = [
            ("127.0.0.1:6432", "127.0.0.1:6432", true),
            ("127.0.0.1:6432", "127.0.0.1:6433", false),
            ("127.0.0.1:6432", "127.0.0.2:6432", false),
            ("0.0.0.0:6432", "127.0.0.1:6432", true),
            ("127.0.0.1:6432", "0.0.0.0:6432", true),
            ("0.0.0.0:6432", "[::1]:6432", false),
            ("[::]:6432", "127.0.0.1:6432", true),
            ("127.0.0.1:0", "127.0.0.1:0", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(listeners_conflict(addr(a), addr(b)), want, "{a} vs {b}");
        }
    }
}
