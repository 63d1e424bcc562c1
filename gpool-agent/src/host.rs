//! What the node has besides GPUs: its CPUs and memory, reported at
//! register so gpoold can refuse a job no node could hold.

/// CPUs online; 0 if the kernel does not say.
pub fn cpus() -> u32 {
    // SAFETY: sysconf reads a kernel value and takes no pointers.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).unwrap_or(0)
}

/// Memory in bytes (`MemTotal` of /proc/meminfo); 0 if unreadable.
pub fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text))
        .unwrap_or(0)
}

fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn meminfo_gives_its_total_in_bytes() {
        let text = "MemTotal:       16318412 kB\nMemFree:         1038284 kB\n";
        assert_eq!(super::mem_total(text), Some(16_318_412 * 1024));
        assert_eq!(super::mem_total("MemFree: 1 kB\n"), None);
        assert!(super::cpus() > 0 && super::memory_bytes() > 0);
    }
}
