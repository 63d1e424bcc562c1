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
