//! `--notify`: a webhook receiver the test runs gets a job's start and end
//! events as JSON POSTs; a pool's gpoold.toml decides which URLs and
//! whether mail may be named.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A plain HTTP/1.1 receiver on a loopback port: each POST's body is kept,
/// and answered 200.
struct Receiver {
    url: String,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hooks/gpool", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let mut length = 0;
                let mut request_line = String::new();
                let _ = reader.read_line(&mut request_line);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        if name.eq_ignore_ascii_case("content-length") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                assert!(request_line.starts_with("POST /hooks/gpool "), "{request_line}");
                if let Ok(value) = serde_json::from_slice(&body) {
                    kept.lock().unwrap().push(value);
                }
                let _ = reader
                    .get_mut()
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            }
        });
        Receiver { url, bodies }
    }

    fn events(&self) -> Vec<serde_json::Value> {
        self.bodies.lock().unwrap().clone()
    }
}

#[test]
fn a_webhook_gets_the_start_and_end_of_each_job_that_asks() {
    let receiver = Receiver::start();
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let ok = cluster.submit(&[
        "--notify",
        &receiver.url,
        "--notify-on",
        "start,end",
        "-J",
        "told",
        "--",
        "true",
    ]);
    let bad = cluster.submit(&[
        "--notify",
        &receiver.url,
        "--notify-on",
        "fail",
        "--",
        "sh",
        "-c",
        "exit 4",
    ]);
    let quiet = cluster.submit(&["--notify", &receiver.url, "--notify-on", "fail", "--", "true"]);
    for id in [ok, quiet] {
        cluster.wait_for_state(id, "completed");
    }
    cluster.wait_for_state(bad, "failed");
    let events = wait_until("3 events", Duration::from_secs(30), || {
        let events = receiver.events();
        (events.len() >= 3).then_some(events)
    });
    let of = |id: u64| -> Vec<String> {
        events
            .iter()
            .filter(|event| event["job"]["id"] == id)
            .map(|event| {
                format!(
                    "{} {}",
                    event["event"].as_str().unwrap(),
                    event["job"]["state"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(of(ok), ["start running", "end completed"], "{events:?}");
    assert_eq!(of(bad), ["fail failed"], "{events:?}");
    assert!(of(quiet).is_empty(), "{events:?}");
    assert_eq!(
        cluster.job(ok)["notify"],
        serde_json::json!({"to": receiver.url, "on": ["start", "end"]})
    );
    let end = events
        .iter()
        .find(|event| event["job"]["id"] == ok && event["event"] == "end")
        .unwrap();
    assert_eq!(end["job"]["name"], "told");
    assert_eq!(end["job"]["exit_code"], 0);
    assert_eq!(end["job"]["nodes"], serde_json::json!(["n1"]));
    let failed = events.iter().find(|event| event["job"]["id"] == bad).unwrap();
    assert_eq!(failed["job"]["exit_code"], 4);
    assert!(failed["job"]["ended_at"].is_string(), "{failed}");
}

/// In config mode the pool's [notify] decides: a URL under an allowed
/// prefix is taken, others and mail (no sendmail set) are refused at
/// submit, naming the field and why.
#[test]
fn a_pool_takes_only_the_webhooks_its_config_allows() {
    let receiver = Receiver::start();
    let prefix = receiver.url.trim_end_matches("/gpool");
    let cluster = Cluster::with_config(&format!("[notify]\nwebhooks = [\"{prefix}/\"]\n"));
    let refused = cluster.gpool(&[
        "submit",
        "--notify",
        "http://169.254.169.254/latest/meta-data",
        "--",
        "true",
    ]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("notify: \"http://169.254.169.254/latest/meta-data\" is not under an allowed prefix"),
        "{}",
        refused.stderr
    );
    let mail = cluster.gpool(&["submit", "--notify", "mail:ops@example.com", "--", "true"]);
    assert_eq!(mail.code, 2, "{}", mail.stderr);
    assert!(mail.stderr.contains("this pool sends no mail"), "{}", mail.stderr);
    let not_a_target = cluster.gpool(&["submit", "--notify", "ops@example.com", "--", "true"]);
    assert_eq!(not_a_target.code, 2, "{}", not_a_target.stderr);
    assert!(
        not_a_target.stderr.contains("neither a webhook"),
        "{}",
        not_a_target.stderr
    );
    let taken = cluster.gpool(&["submit", "--notify", &receiver.url, "--", "true"]);
    assert_eq!(taken.code, 0, "{}", taken.stderr);
}

/// Threads of a process, from /proc.
fn n_threads(pid: nix::unistd::Pid) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A receiver that accepts and never answers, and a 1,000-task array that
/// asks to be told of every start and end: gpoold sends on a few threads
/// of its own, at most two at a time to that receiver, and drops what
/// does not fit its queue (counted), so a cancel and a report answer as
/// they always do and gpoold's threads stay few.
#[test]
fn a_receiver_that_never_answers_slows_no_request() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hooks/gpool", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        // Held open, never answered.
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 8);
    let other = cluster.submit(&["--hold", "--", "true"]);
    let array = cluster.submit(&["--notify", &url, "--notify-on", "all", "-a", "0-999", "--", "true"]);
    let gpoold = cluster.controller().pid();
    let (mut slowest, mut most_threads) = (Duration::ZERO, 0);
    for round in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        let started = std::time::Instant::now();
        cluster.gpool(&["report"]).ok();
        if round == 5 {
            cluster.gpool(&["cancel", &other.to_string()]).ok();
        }
        slowest = slowest.max(started.elapsed());
        most_threads = most_threads.max(n_threads(gpoold));
    }
    println!("hanging receiver: slowest report/cancel {slowest:?}, gpoold threads at most {most_threads}");
    assert!(slowest < Duration::from_secs(5), "{slowest:?}");
    assert!(most_threads < 100, "{most_threads} threads");
    cluster.wait_for_state(other, "cancelled");
    let done = wait_until("the array to end", Duration::from_secs(120), || {
        let listed = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
        let array = listed
            .as_array()
            .and_then(|jobs| jobs.iter().find(|job| job["id"] == array).cloned())?;
        (array["state"] == "completed").then_some(array)
    });
    assert_eq!(done["state"], "completed", "{done}");
}
