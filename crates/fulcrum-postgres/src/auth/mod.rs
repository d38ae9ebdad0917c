//! Authentication as a server would do it (SCRAM-SHA-256 and -PLUS, RFC
//! 5802/7677/5929, and md5), the secrets a server stores (`pg_shadow.passwd`,
//! read by `auth_query`), and the SCRAM client that logs in to a server from a
//! stored verifier and a client's proof without knowing the password. Pure
//! state machines over message payloads; the I/O is in `frontend::login` and
//! `backend::connect`.

pub mod md5;
pub mod scram;
pub mod scram_keys;
pub mod secret;
