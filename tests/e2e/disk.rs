//! A node's disk: a job that fills the spool drains its node and takes no
//! neighbour with it; output past max_output ends its own job; empty
//! output leaves no file.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A small tmpfs mounted by the test, lazily unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Result<SmallDisk, String> {
        std::fs::create_dir_all(at).map_err(|err| err.to_string())?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|err| err.to_string())?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).trim().to_string());
        }
        Ok(SmallDisk(at.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The case: on a node whose spool is a 24 MiB filesystem, one job
/// writes `yes` for as long as it runs. Its neighbour, a requeueable job
/// that was already running there, runs to its own end (the lease, its
/// exit record and the journal need no new space), and the node drains
/// itself with the reason instead of failing every job placed there. Once
/// the hog is cancelled, the node frees its ended jobs' output by itself,
/// the drain is lifted and the next job runs: no admin needed.
#[test]
fn a_job_that_fills_the_spool_drains_its_node_and_spares_its_neighbour() {
    if !nix::unistd::geteuid().is_root() {
        crate::harness::skip("root", "mounting a small spool needs root");
        return;
    }
    // A lease of a few seconds: a node that cannot renew it would fence
    // the neighbour long before the neighbour's own end.
    let mut cluster = Cluster::with_node_timeout("4s");
    let _disk = match SmallDisk::mount(&cluster.spool_dir("node-a"), "24m") {
        Ok(disk) => disk,
        Err(reason) => {
            crate::harness::skip("root", &format!("cannot mount a tmpfs here: {reason}"));
            return;
        }
    };
    let top = format!("controller = \"{}\"\nmin_spool_free = \"4M\"\n", cluster.addr);
    cluster.spawn_agent("node-a", 2, &top, "", None);
    cluster.wait_for_registered("node-a");
    let dir = cluster.dir.path().to_path_buf();
    let neighbour = cluster.submit(&[
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        &format!("touch {}/neighbour-started; sleep 12", dir.display()),
    ]);
    wait_until("the neighbour to start", Duration::from_secs(30), || {
        dir.join("neighbour-started").exists().then_some(())
    });
    let hog = cluster.submit(&[
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        "while :; do yes 2>/dev/null; sleep 0.2; done",
    ]);
    let reason = wait_until("the node to drain itself", Duration::from_secs(30), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        let reason = nodes[0]["drain_reason"].as_str()?.to_string();
        Some(reason)
    });
    assert!(
        reason.starts_with("spool full: ") && reason.contains("min_spool_free 4.0 MiB"),
        "{reason}"
    );
    // A drained node offers no free GPU, whatever is idle on it.
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(nodes[0]["gpus_free"], 0, "{nodes}");
    // The neighbour ends by itself, once, with its own exit code.
    let done = cluster.wait_for_state(neighbour, "completed");
    assert_eq!(done["exit_code"], 0, "{done}");
    assert_eq!(done["attempt"], 1, "never fenced, never requeued: {done}");
    // Nothing new goes to the drained node.
    let waiting = cluster.submit(&["--gpus", "1", "--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(cluster.job(waiting)["state"], "pending");
    // Its user cancels the hog: the node frees the output of its ended
    // jobs by itself, oldest first, lifts the drain, and runs the next.
    cluster.gpool(&["cancel", &hog.to_string()]).ok();
    cluster.wait_for_state(hog, "cancelled");
    cluster.wait_for_state(waiting, "completed");
    let out = cluster.spool_dir("node-a").join(format!("jobs/{hog}.1.out"));
    assert!(!out.exists(), "{} was freed", out.display());
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert!(nodes[0]["drain_reason"].is_null(), "{nodes}");
}

/// A job whose output passes the node's max_output (or its own
/// --max-output) is ended (no grace),
/// its file cut at the cap with a line that says why, and `gpool show`
/// tells it. A job that writes nothing leaves no output file, and its log
/// reads as empty.
#[test]
fn output_past_max_output_ends_its_job_and_empty_output_leaves_no_file() {
    let mut cluster = Cluster::start();
    cluster.start_agent_with("node-a", 1, "");
    let top = format!("controller = \"{}\"\nmax_output = \"1M\"\n", cluster.addr);
    cluster.spawn_agent("node-b", 1, &top, "", None);
    cluster.wait_for_registered("node-b");
    cluster
        .gpool(&["drain", "node-a", "--reason", "keep this test on node-b"])
        .ok();
    let loud = cluster.submit(&["--", "sh", "-c", "yes; sleep 600"]);
    let ended = cluster.wait_for_state(loud, "failed");
    assert!(ended["events"].to_string().contains("max_output"), "{ended}");
    let out = cluster.spool_dir("node-b").join(format!("jobs/{loud}.1.out"));
    let text = std::fs::read(&out).unwrap_or_else(|err| panic!("{}: {err}", out.display()));
    let marker = b"\n[gpool: output cut at max_output (1.0 MiB); the job was ended]\n";
    assert_eq!(text.len(), (1 << 20) + marker.len());
    assert!(text.ends_with(marker));

    // A job's own --max-output is a lower cap than its node's.
    cluster.gpool(&["resume", "node-a"]).ok();
    cluster.gpool(&["drain", "node-b", "--reason", "now node-a"]).ok();
    let capped = cluster.submit(&["--max-output", "2M", "--", "sh", "-c", "yes; sleep 600"]);
    let ended = cluster.wait_for_state(capped, "failed");
    assert_eq!(ended["max_output_bytes"], 2 << 20, "{ended}");
    let out = cluster.spool_dir("node-a").join(format!("jobs/{capped}.1.out"));
    let size = std::fs::metadata(&out).map(|meta| meta.len()).unwrap_or(0);
    assert!(
        (2 << 20..(2 << 20) + 200).contains(&size),
        "{} holds {size} bytes",
        out.display()
    );
    cluster.gpool(&["resume", "node-b"]).ok();
    cluster.gpool(&["drain", "node-a", "--reason", "back to node-b"]).ok();

    let quiet = cluster.submit(&["--", "true"]);
    cluster.wait_for_state(quiet, "completed");
    let jobs = cluster.spool_dir("node-b").join("jobs");
    for suffix in ["out", "err"] {
        let path = jobs.join(format!("{quiet}.1.{suffix}"));
        assert!(!path.exists(), "{} is kept though empty", path.display());
    }
    let log = cluster.gpool(&["logs", &quiet.to_string()]);
    assert_eq!(log.ok(), "");
}
