//! `failover_command`: the placeholders, expanded as Pgpool-II's
//! failover_command does, and running it with a time limit. The expansion is
//! pure; the command runs through `/bin/sh -c`.

use std::time::Duration;

/// What a failover command is told.
#[derive(Debug, Clone)]
pub struct FailoverEvent<'a> {
    pub cluster: &'a str,
    pub old_id: usize,
    pub old_address: &'a str,
    pub new_id: usize,
    pub new_address: &'a str,
}

/// Splits `host:port`, `[v6]:port` or `/socket/dir:port`.
pub fn host_port(address: &str) -> (&str, &str) {
    match address.rsplit_once(':') {
        Some((host, port)) => (host.trim_start_matches('[').trim_end_matches(']'), port),
        None => (address, ""),
    }
}

/// Expands `%d` (old primary's index), `%h` (its host), `%p` (its port),
/// `%m` (new primary's index), `%H` (its host), `%r` (its port), `%c` (the
/// cluster's name) and `%%`. Unknown placeholders are kept as written.
pub fn expand(template: &str, e: &FailoverEvent) -> String {
    let (old_host, old_port) = host_port(e.old_address);
    let (new_host, new_port) = host_port(e.new_address);
    let mut out = String::with_capacity(template.len() + 32);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&e.old_id.to_string()),
            Some('h') => out.push_str(old_host),
            Some('p') => out.push_str(old_port),
            Some('m') => out.push_str(&e.new_id.to_string()),
            Some('H') => out.push_str(new_host),
            Some('r') => out.push_str(new_port),
            Some('c') => out.push_str(e.cluster),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Runs `command` with `sh -c`, killed after `timeout`. Returns its exit
/// code, or an error naming what went wrong.
pub async fn run(command: &str, timeout: Duration) -> Result<i32, String> {
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start /bin/sh: {e}"))?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => Ok(status.code().unwrap_or(-1)),
        Ok(Err(e)) => Err(format!("waiting for it failed: {e}")),
        Err(_) => {
            let _ = child.kill().await;
            Err(format!("still running after {timeout:?}; killed"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> FailoverEvent<'static> {
        FailoverEvent {
            cluster: "main",
            old_id: 0,
            old_address: "10.0.0.1:5432",
            new_id: 2,
            new_address: "[::1]:5433",
        }
    }

    #[test]
    fn placeholders_expand_like_pgpool() {
        assert_eq!(
            expand("promote.sh %d %h %p %m %H %r %c 100%% %x %", &event()),
            "promote.sh 0 10.0.0.1 5432 2 ::1 5433 main 100% %x %"
        );
    }

    #[test]
    fn socket_addresses_split_at_the_last_colon() {
        assert_eq!(
            host_port("/var/run/postgresql:5432"),
            ("/var/run/postgresql", "5432")
        );
        assert_eq!(host_port("db-1:5432"), ("db-1", "5432"));
    }

    #[tokio::test]
    async fn the_command_runs_and_a_slow_one_is_killed() {
        assert_eq!(run("exit 3", Duration::from_secs(5)).await, Ok(3));
        let slow = run("sleep 5", Duration::from_millis(100)).await;
        assert!(slow.unwrap_err().contains("killed"));
    }
}
