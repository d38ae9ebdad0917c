//! Why a backend is out of service, or served unobserved, in words for
//! SHOW BACKENDS' `reason` column: down (with its last probe error),
//! lagging (by how much, against `max_lag`), fenced, disabled by an
//! operator, or in service without a working probe. Pure.

use fulcrum_cluster::{BackendState, BackendStatus};
use fulcrum_config::MaxLag;

/// Empty when the backend is in service and observed.
pub fn reason(status: &BackendStatus, disabled: bool, max_lag: Option<&MaxLag>) -> String {
    match status.state {
        BackendState::Down => format!(
            "down: {}",
            status
                .last_error
                .as_deref()
                .unwrap_or("its health probes fail")
        ),
        BackendState::Stale => "fenced: a former primary that came back writable while another \
                                node is the primary; re-join it as a replica"
            .into(),
        BackendState::Lagging => {
            let limit = match max_lag {
                Some(MaxLag::Bytes(b)) => format!(" (max_lag {})", bytes(*b)),
                Some(MaxLag::Time(t)) => format!(" (max_lag {t:?})"),
                None => String::new(),
            };
            format!(
                "lagging: {} and {:.1}s behind the primary{limit}; no reads until it catches up",
                bytes(status.lag_bytes),
                status.lag_time.as_secs_f64()
            )
        }
        BackendState::Up if disabled => {
            "disabled by an operator: no reads (ENABLE puts it back)".into()
        }
        BackendState::Up if status.probe_login_refused => {
            "in service unobserved: the health probe's login is refused (health_user, \
             health_password or its rights); no lag measured, never promoted"
                .into()
        }
        BackendState::Up => String::new(),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} kB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status(state: BackendState) -> BackendStatus {
        BackendStatus {
            address: "127.0.0.1:5433".into(),
            state,
            primary: false,
            writable: Some(false),
            lag_bytes: 0,
            lag_time: Duration::ZERO,
            last_error: None,
            probe_login_refused: false,
        }
    }

    #[test]
    fn each_state_says_why() {
        assert_eq!(reason(&status(BackendState::Up), false, None), "");
        let mut down = status(BackendState::Down);
        down.last_error = Some("connection refused".into());
        assert_eq!(reason(&down, false, None), "down: connection refused");
        let mut lagging = status(BackendState::Lagging);
        lagging.lag_bytes = 50 * 1024 * 1024;
        lagging.lag_time = Duration::from_millis(4200);
        assert_eq!(
            reason(&lagging, false, Some(&MaxLag::Bytes(16 << 20))),
            "lagging: 50.0 MB and 4.2s behind the primary (max_lag 16.0 MB); no reads until it catches up"
        );
        assert!(reason(&status(BackendState::Stale), false, None).starts_with("fenced:"));
        assert!(reason(&status(BackendState::Up), true, None).starts_with("disabled"));
        let mut unobserved = status(BackendState::Up);
        unobserved.probe_login_refused = true;
        assert!(reason(&unobserved, false, None).contains("login is refused"));
    }
}
