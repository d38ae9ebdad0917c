//! What the tests read about a running process from `/proc`: its resident
//! memory, for the memory-bound tests.

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
