//! A deadline on opening a connection, the same for every protocol's
//! server connect (`connect_timeout`): the whole of it (TCP, TLS, the
//! login) within one timeout, and the protocol's own error past it.

use std::future::Future;
use std::time::Duration;

/// Runs `connecting` for at most `timeout`; past it, the error `timed_out`
/// makes (given the timeout).
pub async fn within<T, E>(
    timeout: Duration,
    connecting: impl Future<Output = Result<T, E>>,
    timed_out: impl FnOnce(Duration) -> E,
) -> Result<T, E> {
    match tokio::time::timeout(timeout, connecting).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finishes_or_times_out() {
        let quick = within(Duration::from_secs(5), async { Ok::<_, String>(1) }, |_| {
            "late".to_owned()
        });
        assert_eq!(quick.await, Ok(1));
        let slow = within(
            Duration::from_millis(10),
            std::future::pending::<Result<u8, String>>(),
            |t| format!("timed out after {t:?}"),
        );
        assert_eq!(slow.await, Err("timed out after 10ms".to_owned()));
    }
}
