//! Keeping a daemon's resident memory near its live heap (glibc's malloc;
//! elsewhere these do nothing). Both daemons set one arena first thing in
//! `main`; gpool-agent starts the trim thread there too, gpoold in `run`
//! (with its sled hook).

/// One malloc arena for the whole process, set before any thread starts.
/// glibc's default (up to 8 per core) spreads each burst of work over many
/// arenas, and the few long-lived blocks left in each keep their pages
/// resident: with 16 arenas gpoold's RSS grew by about 1 MiB per 1,000 ended
/// jobs although its live heap did not. Both daemons' threads allocate
/// little at once, so one lock costs nothing seen.
pub fn use_one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets one of glibc's tunables under its own lock; it
    // takes no pointers.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Free memory glibc may keep without handing it back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_FREE_BYTES: usize = 2 << 20;

/// After a burst (a 10,000-job batch, a long listing, log followers that
/// left) most of a daemon's resident memory may be free memory that glibc
/// keeps in its arena. A thread named `name` looks at how much it holds:
/// past `KEEP_FREE_BYTES`, it hands it back to the system (`malloc_trim`
/// returns free pages from the middle of the arena). Both the look and the
/// trim walk every free block of the arena under its lock, so it looks a
/// quarter of a second after pages were touched (page faults: a burst is
/// going on, and its garbage is gone a quarter of a second after it), and
/// otherwise every 5 s (memory freed without new pages touched). It runs
/// `every_5s` first every 5 s (gpoold collects sled's garbage there).
pub fn return_free_memory_periodically(name: &str, every_5s: fn()) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
            let mut faults_seen = 0;
            for tick in 1u64.. {
                std::thread::sleep(std::time::Duration::from_millis(250));
                let five_seconds = tick % 20 == 0;
                if five_seconds {
                    every_5s();
                }
                if page_faults() == faults_seen && !five_seconds {
                    continue;
                }
                // SAFETY: mallinfo2 and malloc_trim only walk glibc's own
                // heaps, under their locks; they take no pointers of ours.
                unsafe {
                    if libc::mallinfo2().fordblks > KEEP_FREE_BYTES {
                        libc::malloc_trim(0);
                    }
                }
                faults_seen = page_faults();
            }
        });
        if let Err(err) = spawned {
            tracing::warn!("cannot start the memory trim thread: {err}");
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (name, every_5s);
}

/// The process's minor page faults so far: pages it made resident.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn page_faults() -> i64 {
    // SAFETY: getrusage writes into the struct it is given, nothing else.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_minflt
    }
}
