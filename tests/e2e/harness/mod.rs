//! Starting the real binaries in temp dirs on loopback ports (or on
//! addresses in network namespaces the tests create).

pub mod cluster;
pub mod netns;
pub mod process;

/// The path of an outside program a test runs (Prometheus, Chromium), or
/// `None` with a note that the test is skipped. Where `GPOOL_E2E_REQUIRE`
/// names it (`.ci/run` installs and names them all), its absence fails
/// the test instead.
pub fn outside_tool(name: &str, package: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    match found {
        Some(path) => Some(path),
        None if required(name) => {
            panic!("{name} is not installed (Debian's {package}), and GPOOL_E2E_REQUIRE needs it")
        }
        None => {
            eprintln!("skipped: {name} is not installed (Debian's {package}; .ci/run installs it)");
            None
        }
    }
}

/// Whether `GPOOL_E2E_REQUIRE` (comma-separated) names `need`.
pub fn required(need: &str) -> bool {
    std::env::var("GPOOL_E2E_REQUIRE").is_ok_and(|list| list.split(',').any(|item| item.trim() == need))
}

/// A test that cannot run here says why and is skipped; where
/// `GPOOL_E2E_REQUIRE` names `need` (`root`: root, cgroups, namespaces,
/// mounts, containers; `.ci/run` names it), it fails instead.
pub fn skip(need: &str, reason: &str) {
    if required(need) {
        panic!("{reason}, and GPOOL_E2E_REQUIRE needs {need}");
    }
    eprintln!("skipped: {reason}");
}

/// A loopback port nothing listens on now, for a program that takes no
/// port 0 or must listen on the same port again after a restart.
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// A port of `host` nothing listens on now, taken from below the kernel's
/// ephemeral range: a port that `bind(0)` handed out can be taken by any
/// outgoing connection (an agent's, a forwarder's) before the program the
/// test starts binds it. Below that range only another caller of this
/// function could take it, and within one test process none hands out the
/// same port twice.
pub fn free_port_on(host: &str) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    const FIRST: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|low| *low > FIRST + 1_000 && *low <= 65_535)
        .unwrap_or(32_768);
    let span = ephemeral_low - FIRST;
    // Start where this process's id points, so that two test processes
    // running at once are unlikely to walk the same ports.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % span) as u16;
        if std::net::TcpListener::bind((host, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port of {host} below the ephemeral range {ephemeral_low}")
}

/// Status line, headers and body of an HTTP/1.1 `GET path` at `addr`.
pub fn http_get(addr: &str, path: &str) -> (String, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the HTTP address");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}
