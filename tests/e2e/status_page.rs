//! The status page: gpoold's read-only HTML view of the pool, checked as
//! text and rendered in headless Chromium.

use crate::harness::cluster::Cluster;
use std::time::Duration;

use crate::harness::http_get as get;

/// A pool with something to show: two teams, a running job, a pending
/// one, a finished one to charge, and a drained node.
fn busy_pool() -> (Cluster, String) {
    let mut cluster = Cluster::with_config(
        "metrics_listen = \"127.0.0.1:0\"\n[accounting]\ncurrency = \"EUR\"\n[accounting.prices]\nh100 = 4.0\n\n[[team]]\nname = \"ml\"\nguaranteed_gpus = 2\n\n[[team]]\nname = \"vision\"\n",
    );
    cluster.start_agent("n1", 4);
    cluster.start_agent("n2", 2);
    cluster.gpool(&["drain", "n2", "--reason", "fan <failure>"]).ok();
    let done = cluster.submit(&["--team", "vision", "--", "sleep", "1"]);
    cluster.wait_for_state(done, "completed");
    let running = cluster.submit(&["--team", "ml", "--gpus", "3", "--", "sleep", "120"]);
    cluster.wait_for_state(running, "running");
    cluster.submit(&["--team", "vision", "--gpus", "4", "--", "sleep", "1"]);
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).unwrap();
    (cluster, addr.trim().to_string())
}

#[test]
fn the_status_page_shows_allocation_queue_cost_and_nodes_to_a_known_caller() {
    let (cluster, addr) = busy_pool();
    let (status, _, body) = get(&addr, "/status");
    assert!(status.contains("200"), "{status}\n{body}");
    for expected in [
        "Allocation, last 6 hours",
        "Queue per team",
        "Cost this period",
        "Nodes and GPUs",
        ">ml<",
        ">vision<",
        ">n1<",
        ">n2<",
        "drained",
        // User text is escaped, never markup.
        "fan &lt;failure&gt;",
        "6 GPUs on 2 nodes: 3 allocated, 2 out of service",
        "<svg",
    ] {
        assert!(body.contains(expected), "{expected:?} missing from:\n{body}");
    }
    assert!(!body.contains("fan <failure>"), "{body}");
    // No outside assets: nothing is fetched from anywhere.
    assert!(!body.contains("src=") && !body.contains("href="), "{body}");
    // Cost: vision's finished job, priced.
    assert!(body.contains("EUR"), "{body}");

    // A wrong token in the address is refused, with a form for a right one.
    let (status, _, body) = get(&addr, "/status?token=gp_1.wrong");
    assert!(status.contains("401"), "{status}\n{body}");
    assert!(body.contains("<form"), "{body}");
    // A right one becomes an HttpOnly cookie, and the address drops it.
    let token = cluster
        .gpool(&["admin", "token", "create", "--user", "nobody", "--output", "json"])
        .json()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, headers, _) = get(&addr, &format!("/status?token={token}"));
    assert!(status.contains("303"), "{status}");
    assert!(headers.to_ascii_lowercase().contains("location: /status"), "{headers}");
    assert!(headers.contains(&format!("gpool_token={token}; HttpOnly")), "{headers}");
}

#[test]
fn the_status_page_renders_in_headless_chromium() {
    let Some(chromium) = crate::harness::outside_tool("chromium", "chromium") else {
        return;
    };
    let (_cluster, addr) = busy_pool();
    let dir = Cluster::temp_dir();
    let run = |extra: &[&str]| {
        let output = std::process::Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1200,1300",
            ])
            .arg(format!("--user-data-dir={}", dir.path().join("profile").display()))
            .args(extra)
            .arg(format!("http://{addr}/status"))
            .output()
            .expect("run chromium");
        assert!(
            output.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    // The DOM Chromium built from the page has the data in it.
    let dom = run(&["--dump-dom"]);
    for expected in [">ml<", ">vision<", ">n1<", "<polygon", "3 allocated"] {
        assert!(dom.contains(expected), "{expected:?} missing from the DOM:\n{dom}");
    }
    // And it draws: a screenshot of the whole page, kept where
    // GPOOL_STATUS_SCREENSHOT says (to look at).
    let shot = dir.path().join("status.png");
    run(&[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    if let Some(keep) = std::env::var_os("GPOOL_STATUS_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    std::thread::sleep(Duration::from_millis(10));
}
