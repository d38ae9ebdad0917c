//! The MySQL protocol end to end: proxying, routing, sysbench, PyMySQL, bad
//! input, credentials, TLS. One test binary; each module was a test binary
//! of its own before.

mod my_bad_input;
mod my_credentials;
mod my_drivers;
mod my_proxy;
mod my_routing;
mod my_sysbench;
mod my_tls;
