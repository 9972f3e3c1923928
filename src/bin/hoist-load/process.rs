//! Process statistics from /proc: the CPU time, RSS, threads and open
//! files of the server measured (and of the load generator itself).

use tokio::time::Instant;

/// Linux reports CPU time in /proc in USER_HZ, 100 on every mainstream
/// architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime of a process, in ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields start after its `)`.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// VmRSS in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Threads of a process.
pub(crate) fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|rest| rest.trim().parse().ok())
}

/// Open file descriptors of a process.
pub(crate) fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// CPU used by `pid` between two readings, as a percentage of one core.
pub(crate) struct CpuWindow {
    pid: u32,
    ticks: u64,
    at: Instant,
}

impl CpuWindow {
    pub(crate) fn start(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            ticks: cpu_ticks(pid)?,
            at: Instant::now(),
        })
    }

    /// (percent of one core, CPU seconds used)
    pub(crate) fn finish(&self) -> Option<(f64, f64)> {
        let ticks = cpu_ticks(self.pid)?.saturating_sub(self.ticks);
        let seconds = ticks as f64 / TICKS_PER_SECOND;
        let elapsed = self.at.elapsed().as_secs_f64();
        Some((100.0 * seconds / elapsed, seconds))
    }
}
