//! What the tests read about a running process from `/proc`: its resident
//! memory, for the memory-bound tests; and the processes a binary upgrade
//! starts (their pid from the log, killed when a test ends).

/// A process's resident memory, in kB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// The pid of the process the `nth` (from 1) binary upgrade in `log` handed
/// over to (its `handed over to process <pid>` line), if there is one yet.
pub fn upgraded_to(log: &str, nth: usize) -> Option<u32> {
    log.match_indices("handed over to process ")
        .filter_map(|(at, m)| {
            log[at + m.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|d| d.parse().ok())
        })
        .nth(nth.checked_sub(1)?)
}

/// Kills process `pid` (SIGKILL) when dropped: for what a binary upgrade
/// started, which is not the test's child and outlives its parent.
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}
