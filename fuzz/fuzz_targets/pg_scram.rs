//! SCRAM-SHA-256 both ways. Mode 0: Fulcrum's server side (`auth::scram`)
//! given a client's SASLInitialResponse body (read as login does) and then its
//! client-final message. Mode 1: the client side Fulcrum uses towards its
//! servers (postgres-protocol's `ScramSha256`) given a server-first message
//! (after the client nonce, which the fuzzer cannot guess) and a server-final
//! message. Input: mode byte, two-byte length of the first message, the first
//! message, then the second. Every call must return, never panic.
#![no_main]

use std::sync::OnceLock;

use fulcrum_postgres::auth::scram::{ScramServer, Verifier};
use fulcrum_postgres::codec::frontend_msg::sasl_initial_msg;
use libfuzzer_sys::fuzz_target;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

fn verifier() -> &'static Verifier {
    static V: OnceLock<Verifier> = OnceLock::new();
    V.get_or_init(|| Verifier::new("pencil", b"fuzz-salt", 16))
}

/// The iteration count at the end of a server-first message, if it ends in one.
fn iterations(server_first: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(server_first).ok()?;
    let last = text.rsplit(',').next()?;
    last.strip_prefix("i=")?.parse().ok()
}

fuzz_target!(|data: &[u8]| {
    let [mode, a, b, rest @ ..] = data else {
        return;
    };
    let split = usize::from(u16::from_le_bytes([*a, *b])).min(rest.len());
    let (first, second) = rest.split_at(split);
    if mode % 2 == 0 {
        let mut server = ScramServer::new(verifier().clone(), "SERVERNONCE".into());
        let client_first = match sasl_initial_msg(first) {
            Some((_, data)) => data,
            None => first,
        };
        if server.server_first(client_first).is_ok() {
            let _ = server.server_final(second);
        }
    } else {
        let mut client = ScramSha256::new(b"pencil", ChannelBinding::unsupported());
        let start = String::from_utf8_lossy(client.message()).into_owned();
        let nonce = start.rsplit("r=").next().unwrap_or_default().to_owned();
        let mut server_first = format!("r={nonce}").into_bytes();
        server_first.extend_from_slice(first);
        // Each iteration is one HMAC: keep runs fast (real servers use 4096).
        if iterations(&server_first).is_some_and(|i| i > 64) {
            return;
        }
        if client.update(&server_first).is_ok() {
            let _ = client.finish(second);
        }
    }
});
