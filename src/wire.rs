//! Raw PostgreSQL protocol bytes for the tests that speak the wire
//! themselves (bad input, direct TLS, the admin console's first answer).

/// The PostgreSQL protocol 3.0 version code of a startup packet.
pub const PROTOCOL_3_0: i32 = 196_608;

/// A startup packet: length, `code` (a protocol version or a special
/// request code), then `params` as NUL-terminated name/value pairs.
pub fn startup_message(code: i32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    for (name, value) in params {
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut packet = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    packet.extend_from_slice(&body);
    packet
}
