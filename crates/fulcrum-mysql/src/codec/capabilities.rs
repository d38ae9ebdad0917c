//! Which capability flags Fulcrum offers, and how the sets of a client, of
//! Fulcrum and of a server combine. The flags are mysql_common's
//! `CapabilityFlags`; this module only decides which ones Fulcrum can honour as a
//! proxy that forwards raw packets between a client and a pooled server connection.
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/group__group__cs__capabilities__flags.html>.

use mysql_common::constants::CapabilityFlags as C;

/// What Fulcrum offers clients (and asks of servers). Each flag is here because
/// forwarding it unchanged is safe and clients expect it:
///
/// - `LONG_PASSWORD`: set by every server since 4.1. In MariaDB this bit is
///   `CLIENT_MYSQL`; keeping it tells MariaDB clients not to send MariaDB's
///   extended capabilities, none of which Fulcrum handles.
/// - `LONG_FLAG`: 2-byte column flags in column definitions; always on since 4.1.
/// - `CONNECT_WITH_DB`: the client may name a default database in its handshake
///   response; Fulcrum applies it on the server connection it hands out.
/// - `LOCAL_FILES`: lets `LOAD DATA LOCAL INFILE` work; the server's 0xFB
///   request and the client's file packets are forwarded like any other. The
///   server's own `local_infile` setting still decides.
/// - `PROTOCOL_41`: the only protocol Fulcrum speaks (SQL state in ERR,
///   warnings and status in OK/EOF, HandshakeResponse41).
/// - `TRANSACTIONS`: status flags in OK/EOF, which transaction tracking reads.
/// - `SECURE_CONNECTION`: 20-byte scrambles and length-prefixed auth responses.
/// - `MULTI_STATEMENTS`, `MULTI_RESULTS`: `a; b` in one COM_QUERY, and several
///   result sets (also needed for `CALL`); the response ends at the first OK,
///   ERR or EOF without `SERVER_MORE_RESULTS_EXISTS`, which the forwarder reads.
/// - `PS_MULTI_RESULTS`: `CALL` through prepared statements.
/// - `PLUGIN_AUTH`: named auth plugins, so Fulcrum can ask for
///   mysql_native_password or caching_sha2_password and switch between them.
/// - `PLUGIN_AUTH_LENENC_CLIENT_DATA`: auth responses longer than 255 bytes.
/// - `CONNECT_ATTRS`: clients send attributes (program name, driver); Fulcrum
///   skips them, and refusing the flag would only make some drivers warn.
/// - `SESSION_TRACK`: OK packets carry session-state changes, where Fulcrum
///   reads the GTID of a write (read-your-writes) and schema changes.
/// - `DEPRECATE_EOF`: result sets end with an OK (0xFE) rather than EOF, so the
///   end of a result set carries session-state changes too.
///
/// Not offered: `COMPRESS` and `ZSTD_COMPRESSION_ALGORITHM` (Fulcrum would have
/// to decompress to see commands), `SSL` (added by the caller only when TLS is
/// configured), `QUERY_ATTRIBUTES` (moves the query text of COM_QUERY),
/// `OPTIONAL_RESULTSET_METADATA` (changes the result set layout),
/// `FOUND_ROWS`, `IGNORE_SPACE`, `INTERACTIVE` and `NO_SCHEMA` (per-connection
/// server behaviour that a pooled connection cannot take from each client),
/// `CAN_HANDLE_EXPIRED_PASSWORDS` and `MULTI_FACTOR_AUTHENTICATION` (Fulcrum
/// authenticates clients itself), `PROGRESS_OBSOLETE` (MariaDB progress
/// reports inside ERR packets).
pub const OFFERED: C = C::CLIENT_PROTOCOL_41
    .union(C::CLIENT_SECURE_CONNECTION)
    .union(C::CLIENT_PLUGIN_AUTH)
    .union(C::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA)
    .union(C::CLIENT_CONNECT_WITH_DB)
    .union(C::CLIENT_MULTI_STATEMENTS)
    .union(C::CLIENT_MULTI_RESULTS)
    .union(C::CLIENT_PS_MULTI_RESULTS)
    .union(C::CLIENT_DEPRECATE_EOF)
    .union(C::CLIENT_TRANSACTIONS)
    .union(C::CLIENT_LONG_PASSWORD)
    .union(C::CLIENT_LONG_FLAG)
    .union(C::CLIENT_LOCAL_FILES)
    .union(C::CLIENT_SESSION_TRACK)
    .union(C::CLIENT_CONNECT_ATTRS);

/// Without these Fulcrum cannot talk to a peer at all.
pub const REQUIRED: C = C::CLIENT_PROTOCOL_41
    .union(C::CLIENT_SECURE_CONNECTION)
    .union(C::CLIENT_PLUGIN_AUTH);

/// Flags that change the bytes of server responses Fulcrum forwards unchanged:
/// a client may only be served by a server connection that agrees on them.
pub const WIRE_FORMAT: C = C::CLIENT_DEPRECATE_EOF.union(C::CLIENT_SESSION_TRACK);

/// What Fulcrum offers clients: [`OFFERED`], plus `SSL` when it has TLS configured.
pub fn offered(tls: bool) -> C {
    if tls {
        OFFERED | C::CLIENT_SSL
    } else {
        OFFERED
    }
}

/// The flags in force on a connection: those both sides set. (A client's
/// response may only carry flags the server offered; servers treat any extra
/// bits as absent, and so does this.)
pub fn negotiate(peer: C, offered: C) -> C {
    peer & offered
}

/// The required flags a peer lacks; empty when Fulcrum can talk to it.
pub fn missing_required(peer: C) -> C {
    REQUIRED - peer
}

/// What Fulcrum sets in its handshake response to a server that announced
/// `server`: the offered flags the server supports (`SSL` is the caller's to add).
pub fn for_server(server: C) -> C {
    negotiate(server, OFFERED)
}

/// The [`WIRE_FORMAT`] flags on which a client's negotiated set and a server
/// connection's differ; empty when the connection can serve the client.
pub fn wire_format_mismatch(client: C, server_conn: C) -> C {
    (client ^ server_conn) & WIRE_FORMAT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_set_has_the_documented_bits() {
        // 0x0001 | 0x0004 | 0x0008 | 0x0080 | 0x0200 | 0x2000 | 0x8000
        // | 0x1_0000 | 0x2_0000 | 0x4_0000 | 0x8_0000 | 0x10_0000 | 0x20_0000
        // | 0x80_0000 | 0x100_0000
        assert_eq!(OFFERED.bits(), 0x01BF_A28D);
        assert!(!OFFERED.contains(C::CLIENT_SSL));
        assert!(offered(true).contains(C::CLIENT_SSL));
        assert!(!OFFERED.intersects(C::CLIENT_COMPRESS | C::CLIENT_QUERY_ATTRIBUTES));
    }

    #[test]
    fn negotiation_keeps_what_both_sides_set() {
        let client = C::CLIENT_PROTOCOL_41
            | C::CLIENT_SECURE_CONNECTION
            | C::CLIENT_PLUGIN_AUTH
            | C::CLIENT_COMPRESS
            | C::CLIENT_FOUND_ROWS;
        let n = negotiate(client, OFFERED);
        assert_eq!(n, REQUIRED);
        assert!(missing_required(n).is_empty());
        assert_eq!(
            missing_required(C::CLIENT_PROTOCOL_41),
            C::CLIENT_SECURE_CONNECTION | C::CLIENT_PLUGIN_AUTH
        );
    }

    #[test]
    fn an_old_server_without_deprecate_eof_or_session_track() {
        let server = OFFERED - C::CLIENT_DEPRECATE_EOF - C::CLIENT_SESSION_TRACK;
        let backend = for_server(server | C::CLIENT_COMPRESS);
        assert_eq!(backend, server);
        assert_eq!(wire_format_mismatch(OFFERED, backend), WIRE_FORMAT);
        assert!(wire_format_mismatch(server, backend).is_empty());
        assert!(wire_format_mismatch(OFFERED, OFFERED).is_empty());
    }
}
