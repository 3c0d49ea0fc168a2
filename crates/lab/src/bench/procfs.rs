//! What a process costs the machine, read from `/proc`: CPU time and resident memory.
//!
//! CPU time is user plus system time (`utime + stime` in `/proc/<pid>/stat`), in clock ticks of
//! 10 ms on Linux, converted to microseconds. The benchmark takes it before and after a scenario
//! and divides the difference by the requests served, so a tick's granularity disappears in the
//! thousands of requests of a run.

use std::fs;

/// One process whose CPU time the benchmark reports.
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    pid: u32,
    /// Count its children too: PostgreSQL does its work in one backend process per connection,
    /// all children of the postmaster.
    with_children: bool,
}

impl Watched {
    /// The process alone: its own threads.
    pub fn process(pid: u32) -> Watched {
        Watched { pid, with_children: false }
    }

    /// The process and its children: the live ones, and those it has already reaped (whose time
    /// the kernel has added to its `cutime`/`cstime`), so a child that exits in between is still
    /// counted once.
    pub fn tree(pid: u32) -> Watched {
        Watched { pid, with_children: true }
    }

    /// This process (the benchmark's own threads, not its children).
    pub fn this_process() -> Watched {
        Watched::process(std::process::id())
    }

    /// CPU time used so far, in microseconds; `None` once the process is gone.
    pub fn cpu_us(&self) -> Option<u64> {
        let stat = Stat::read(self.pid)?;
        if !self.with_children {
            return Some(stat.own_us());
        }
        let children: u64 = live_processes()
            .filter_map(Stat::read)
            .filter(|child| child.ppid == self.pid)
            .map(|child| child.own_us() + child.reaped_us())
            .sum();
        Some(stat.own_us() + stat.reaped_us() + children)
    }
}

/// CPU time this process's children have used and it has waited for (a `pgbench` run, once it
/// exited), in microseconds.
pub fn reaped_children_cpu_us() -> u64 {
    Stat::read(std::process::id()).map_or(0, |stat| stat.reaped_us())
}

/// The process's resident memory (`VmRSS` in `/proc/<pid>/status`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// The fields of `/proc/<pid>/stat` we read.
struct Stat {
    ppid: u32,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

impl Stat {
    fn read(pid: u32) -> Option<Stat> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces; the fields after it
        // start with the state (field 3).
        let (_, rest) = stat.rsplit_once(") ")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            ppid: u32::try_from(field(4)?).ok()?,
            utime: field(14)?,
            stime: field(15)?,
            cutime: field(16)?,
            cstime: field(17)?,
        })
    }

    fn own_us(&self) -> u64 {
        ticks_to_us(self.utime + self.stime)
    }

    fn reaped_us(&self) -> u64 {
        ticks_to_us(self.cutime + self.cstime)
    }
}

fn ticks_to_us(ticks: u64) -> u64 {
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100);
    ticks * 1_000_000 / per_second.max(1) as u64
}

/// The pids of every process there is now.
fn live_processes() -> impl Iterator<Item = u32> {
    fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_cpu_and_memory() {
        let before = Watched::this_process().cpu_us().unwrap();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(Watched::this_process().cpu_us().unwrap() >= before);
        assert!(Watched::tree(std::process::id()).cpu_us().unwrap() >= before);
        assert!(rss_kib(std::process::id()).unwrap() > 0);
        assert_eq!(Watched::process(u32::MAX).cpu_us(), None);
    }
}
