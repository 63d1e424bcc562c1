//! A real cluster's security, end to end: a CA and certificates made with
//! `gpool admin`, gpoold on TLS, agents on other "hosts" (their own network
//! namespaces where the test runs as root), users with tokens, the local
//! socket, and the rules about whose jobs one may see and touch.

use crate::harness::cluster::{gpool_command, Cluster, Run};
use crate::harness::netns::Net;
use crate::harness::process::{binary, wait_until};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `gpool` on the controller host, as root, through its state dir's CA.
fn admin(state_dir: &Path, args: &[&str]) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    let state = state_dir.display().to_string();
    all.extend(["--state-dir", &state]);
    let run: Run = gpool_command(&all).output().expect("run gpool").into();
    run.ok();
    run
}

/// `gpool` over TCP + TLS with `token` (none if empty), from a home with
/// no config of its own.
fn remote(cluster: &Cluster, ca: &Path, token: &str, args: &[&str]) -> Run {
    let mut command = gpool_command(args);
    command
        .env("GPOOL_SERVER", format!("https://{}", cluster.addr))
        .env("GPOOL_CA", ca)
        .env("HOME", cluster.dir.path());
    if token.is_empty() {
        command.env_remove("GPOOL_TOKEN");
    } else {
        command.env("GPOOL_TOKEN", token);
    }
    command.output().expect("run gpool").into()
}

fn refused(run: &Run, needle: &str) {
    assert_ne!(run.code, 0, "expected a refusal, got stdout: {}", run.stdout);
    assert!(run.stderr.contains(needle), "expected {needle:?} in: {}", run.stderr);
}

fn wait_for_log(cluster: &Cluster, agent_idx: usize, needle: &str) {
    wait_for_text(&cluster.agents[agent_idx].log, needle);
}

fn wait_for_text(log: &Path, needle: &str) {
    wait_until(
        &format!("{needle:?} in {}", log.display()),
        Duration::from_secs(30),
        || std::fs::read_to_string(log).ok()?.contains(needle).then_some(()),
    );
}

struct Pki {
    ca: PathBuf,
    certs: PathBuf,
}

impl Pki {
    /// `controller = https://…`, the CA, and node `cert_name`'s files.
    fn agent_top(&self, cluster: &Cluster, cert_name: Option<&str>) -> String {
        let mut top = format!(
            "controller = \"https://{}\"\nca = \"{}\"\n",
            cluster.addr,
            self.ca.display()
        );
        if let Some(name) = cert_name {
            top += &format!(
                "cert = \"{}\"\nkey = \"{}\"\n",
                self.certs.join(format!("{name}.pem")).display(),
                self.certs.join(format!("{name}.key")).display()
            );
        }
        top
    }
}

#[test]
fn agents_need_their_own_valid_certificate_and_users_their_own_token() {
    if !nix::unistd::geteuid().is_root() {
        crate::harness::skip(
            "root",
            "this test runs jobs and commands as other users (nobody, daemon), which needs root",
        );
        return;
    }
    // Agents on hosts of their own where the test may make them.
    let mut net = match Net::create() {
        Ok(net) => Some(net),
        Err(reason) => {
            eprintln!("agents run on loopback, not in network namespaces: {reason}");
            None
        }
    };
    let host = net.as_ref().map_or_else(|| "127.0.0.1".to_string(), Net::gateway);
    let dir = Cluster::temp_dir();
    // Local users (nobody, below) reach the socket through the state dir.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state_dir = dir.path().join("state");
    let certs = dir.path().join("certs");
    admin(&state_dir, &["admin", "ca", "init"]);
    let out = certs.display().to_string();
    admin(
        &state_dir,
        &["admin", "cert", "issue", "--controller", &host, "--out", &out],
    );
    for node in ["n1", "n2", "n3"] {
        admin(&state_dir, &["admin", "cert", "issue", "--node", node, "--out", &out]);
    }
    admin(
        &state_dir,
        &[
            "admin",
            "cert",
            "issue",
            "--node",
            "old",
            "--expires",
            "1s",
            "--out",
            &out,
        ],
    );
    // Expiry is checked to the second: a 1 s certificate is surely expired
    // 2.5 s after it was made.
    let old_expired_at = std::time::Instant::now() + Duration::from_millis(2500);
    let pki = Pki {
        ca: state_dir.join("ca/ca.pem"),
        certs: certs.clone(),
    };
    let tls = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[[team]]\nname = \"nlp\"\nmembers = [\"nobody\"]\n\n[[team]]\nname = \"vision\"\nmembers = [\"daemon\"]\n",
        certs.join(format!("{host}.pem")).display(),
        certs.join(format!("{host}.key")).display()
    );
    let mut cluster = Cluster::with_config_in(dir, &host, &tls);
    let mut hosts = Vec::new();
    for _ in 0..5 {
        hosts.push(net.as_mut().map(|net| net.add_host().expect("a network namespace").0));
    }
    let ns = |idx: usize| hosts[idx].as_deref();

    // The right certificate registers; the agent is on another address.
    let top = pki.agent_top(&cluster, Some("n1"));
    cluster.spawn_agent("n1", 2, &top, "", ns(0));
    cluster.wait_for_registered("n1");
    // Another node's certificate, none, an expired one: refused, with why.
    let top = pki.agent_top(&cluster, Some("n2"));
    let wrong = cluster.spawn_agent("n9", 1, &top, "", ns(1));
    wait_for_log(
        &cluster,
        wrong,
        "the agent's certificate is for node n2, but it registers as n9",
    );
    let top = pki.agent_top(&cluster, None);
    let none = cluster.spawn_agent("n2", 1, &top, "", ns(2));
    wait_for_log(&cluster, none, "agents must present a client certificate");
    std::thread::sleep(old_expired_at.saturating_duration_since(std::time::Instant::now()));
    let top = pki.agent_top(&cluster, Some("old"));
    cluster.spawn_agent("old", 1, &top, "", ns(3));
    let controller_log = cluster.controller.as_ref().unwrap().log.clone();
    wait_for_text(
        &controller_log,
        "TLS handshake refused: invalid peer certificate: certificate expired",
    );
    // A revoked certificate: its live link ends at the reload, and it
    // cannot come back.
    let top = pki.agent_top(&cluster, Some("n3"));
    let revoked = cluster.spawn_agent("n3", 1, &top, "", ns(4));
    cluster.wait_for_registered("n3");
    admin(&state_dir, &["admin", "cert", "revoke", "--node", "n3"]);
    cluster.gpool(&["admin", "reload"]).ok();
    wait_for_log(&cluster, revoked, "is revoked");
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let names: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["n1", "n3"], "refused agents never became nodes");

    // Users: tokens issued through the local socket (root is an admin).
    let whoami = cluster.gpool(&["whoami", "--output", "json"]).json();
    assert_eq!(
        (whoami["admin"].as_bool(), whoami["via"].as_str()),
        (Some(true), Some("unix socket"))
    );
    let token_of = |user: &str, extra: &[&str]| -> String {
        let mut args = vec!["admin", "token", "create", "--user", user, "--output", "json"];
        args.extend_from_slice(extra);
        cluster.gpool(&args).json()["token"].as_str().unwrap().to_string()
    };
    let alice = token_of("nobody", &[]);
    let bob = token_of("daemon", &[]);
    let me = remote(&cluster, &pki.ca, &alice, &["whoami", "--output", "json"]).json();
    assert_eq!(
        (me["user"].as_str(), me["via"].as_str()),
        (Some("nobody"), Some("token 1"))
    );
    refused(&remote(&cluster, &pki.ca, "", &["jobs"]), "no credential");
    let mut wrong_token = alice.clone();
    wrong_token.replace_range(wrong_token.len() - 1.., if alice.ends_with('0') { "1" } else { "0" });
    refused(&remote(&cluster, &pki.ca, &wrong_token, &["jobs"]), "token 1 is wrong");
    refused(
        &remote(&cluster, &pki.ca, "gpool_x", &["jobs"]),
        "the token is malformed",
    );
    // Without the CA, the CLI will not send a token in clear text.
    let no_ca = gpool_command(&["jobs"])
        .env("GPOOL_SERVER", "ctl.invalid:1")
        .env("HOME", cluster.dir.path())
        .env("GPOOL_TOKEN", &alice)
        .env_remove("GPOOL_CA")
        .output()
        .unwrap();
    assert_eq!(no_ca.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_ca.stderr).contains("refusing to send your token in clear text"));

    // The local socket knows a plain user by their uid, with no token.
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
    let socket_whoami = cluster
        .gpool_as(&nobody, &cluster.cli_server, &["whoami", "--output", "json"])
        .json();
    assert_eq!(socket_whoami["user"], "nobody");
    assert_eq!(socket_whoami["admin"], false);

    // Alice's job: its command, env and output are hers alone. Inside it,
    // `gpool` acts as her with the job's own token, from its node.
    // The job's user needs a gpool it can run: the copy gpool_as made.
    let gpool_bin = cluster.dir.path().join("gpool").display().to_string();
    let job_script = "echo secret-output; \"$CLI_BIN\" whoami --output json > \"$GPOOL_CHECKPOINT_DIR/who\"; sleep 60";
    let submitted = remote(
        &cluster,
        &pki.ca,
        &alice,
        &[
            "submit",
            "--output",
            "json",
            "--team",
            "nlp",
            "--env",
            "SECRET=hunter2",
            "--env",
            &format!("CLI_BIN={gpool_bin}"),
            "--workdir",
            "/",
            "--",
            "sh",
            "-c",
            job_script,
        ],
    );
    submitted.ok();
    let id = submitted.json()["ids"][0].as_u64().unwrap().to_string();
    let who_file = cluster.spool_dir("n1").join(format!("checkpoints/{id}/who"));
    let who: Value = wait_until("the job's whoami", Duration::from_secs(30), || {
        serde_json::from_str(&std::fs::read_to_string(&who_file).ok()?).ok()
    });
    assert_eq!(who["user"], "nobody");
    assert_eq!(who["via"], format!("job token of job {id}"));
    let mine = remote(&cluster, &pki.ca, &alice, &["show", &id, "--output", "json"]).json();
    assert_eq!(mine["redacted"], false);
    assert!(mine["command"].as_array().is_some_and(|c| !c.is_empty()));
    let theirs = remote(&cluster, &pki.ca, &bob, &["show", &id, "--output", "json"]);
    assert_eq!(theirs.json()["redacted"], true);
    assert!(!theirs.stdout.contains("hunter2") && !theirs.stdout.contains("secret-output"));
    let listed = remote(&cluster, &pki.ca, &bob, &["jobs", "--output", "json"]);
    assert!(!listed.stdout.contains("hunter2"), "{}", listed.stdout);
    let entry = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["id"].as_u64().map(|n| n.to_string()).as_deref() == Some(id.as_str()))
        .cloned();
    let entry = entry.expect("another user's job is listed as a queue entry");
    assert_eq!(
        (entry["redacted"].as_bool(), entry["team"].as_str()),
        (Some(true), Some("nlp"))
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["logs", &id]),
        "may not read the details of job",
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["cancel", &id]),
        &format!("user daemon may not cancel job {id}"),
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["cancel", "--signal", "USR1", &id]),
        "may not signal",
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["submit", "--team", "nlp", "--", "true"]),
        "team nlp has members nobody only",
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["submit", "--priority", "1000", "--", "true"]),
        "priority is above max_user_priority (100)",
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["submit", "--team", "nlpp", "--", "true"]),
        "no team \"nlpp\" (there are: nlp, vision)",
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["drain", "n1", "--reason", "x"]),
        "only admins may",
    );
    refused(
        &remote(&cluster, &pki.ca, &bob, &["admin", "token", "list"]),
        "only admins may",
    );
    let logs = remote(&cluster, &pki.ca, &alice, &["logs", &id]);
    assert_eq!(logs.ok().trim(), "secret-output");
    // Nor can bob read it through the node's spool.
    let out_file = cluster.spool_dir("n1").join(format!("jobs/{id}.1.out"));
    let daemon = nix::unistd::User::from_name("daemon").unwrap().expect("user daemon");
    let peek = std::process::Command::new("cat")
        .arg(&out_file)
        .current_dir("/")
        .uid(daemon.uid.as_raw())
        .gid(daemon.gid.as_raw())
        .output()
        .unwrap();
    assert!(!peek.status.success(), "daemon read {}", out_file.display());
    assert!(String::from_utf8_lossy(&peek.stderr).contains("Permission denied"));
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&out_file), 0o600);
    assert_eq!(mode(who_file.parent().unwrap()), 0o700);

    // Revocation and expiry hold from the next request on.
    let brief = token_of("daemon", &["--expires", "1s"]);
    let brief_expired_at = std::time::Instant::now() + Duration::from_millis(1100);
    cluster.gpool(&["admin", "token", "revoke", "2"]).ok();
    refused(&remote(&cluster, &pki.ca, &bob, &["jobs"]), "token 2 was revoked");
    std::thread::sleep(brief_expired_at.saturating_duration_since(std::time::Instant::now()));
    refused(&remote(&cluster, &pki.ca, &brief, &["jobs"]), "token 3 expired");

    // An admin sees and cancels anyone's job; the refusals are audited.
    let full = cluster.gpool(&["show", &id, "--output", "json"]).json();
    assert_eq!(full["redacted"], false);
    cluster.gpool(&["cancel", &id]).ok();
    let audit = std::fs::read_to_string(state_dir.join("audit.log")).unwrap();
    let lines: Vec<Value> = audit.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let has = |action: &str, caller: &str, outcome: &str| {
        lines.iter().any(|l| {
            l["action"] == action
                && l["caller"] == caller
                && l["outcome"].as_str().is_some_and(|o| o.starts_with(outcome))
        })
    };
    assert!(
        has("cancel", "daemon", "refused: user daemon may not cancel"),
        "{audit}"
    );
    assert!(has("signal", "daemon", "refused"), "{audit}");
    assert!(has("logs", "daemon", "refused"), "{audit}");
    assert!(has("submit", "daemon", "refused"), "{audit}");
    assert!(has("drain", "daemon", "refused"), "{audit}");
    assert!(has("token create", "root", "allowed"), "{audit}");
    assert!(has("reload", "root", "allowed"), "{audit}");
    assert!(has("authenticate", "", "refused: token 2 was revoked"), "{audit}");
    assert!(has("agent register", "n2", "refused"), "{audit}");
    // Only the one call made without a token: the `Leader` question an
    // agent asks on connecting needs no credential, and is not refused.
    let no_credential = lines
        .iter()
        .filter(|l| {
            l["outcome"]
                .as_str()
                .is_some_and(|o| o.starts_with("refused: no credential"))
        })
        .count();
    assert_eq!(no_credential, 1, "{audit}");
    assert!(
        has(
            "tls handshake",
            "",
            "refused: invalid peer certificate: certificate expired"
        ),
        "{audit}"
    );
    drop(cluster);
    drop(net);
}

/// A job gets no descriptor its agent was started with. A shell or a
/// wrapper that starts the agent with a file open (here a root-only one,
/// read-write, on descriptor 9) hands the jobs of other users nothing: the
/// agent marks what it inherited close-on-exec before it starts anything.
#[test]
fn a_job_inherits_no_descriptor_its_agent_was_started_with() {
    let mut cluster = Cluster::start();
    let secret = cluster.dir.path().join("root-only");
    std::fs::write(&secret, "secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&secret)
        .unwrap();
    cluster.agent_inherits = Some((held, 9));
    cluster.start_agent("node-a", 1);
    // Each descriptor the job's shell holds, and what it is.
    let script = "for fd in /proc/$$/fd/*; do echo \"${fd##*/} $(readlink \"$fd\")\"; done";
    let args = ["submit", "--wait", "--workdir", "/", "--", "sh", "-c", script];
    let run = match nix::unistd::User::from_name("nobody").unwrap() {
        Some(nobody) if nix::unistd::geteuid().is_root() => cluster.gpool_as(&nobody, &cluster.addr, &args),
        _ => cluster.gpool(&args),
    };
    let id = run.ok().trim().to_string();
    let out = std::fs::read_to_string(cluster.spool_dir("node-a").join(format!("jobs/{id}.1.out"))).unwrap();
    assert!(out.lines().any(|line| line.starts_with("1 ")), "the listing ran: {out}");
    assert!(
        !out.contains("root-only") && !out.lines().any(|line| line.starts_with("9 ")),
        "the job holds the agent's descriptor: {out}"
    );
}

/// A gpoold listening on loopback only needs no TLS: its TCP callers are
/// known by the uid that owns their socket, whatever name they send.
#[test]
fn loopback_callers_are_known_by_their_socket_owner() {
    let dir = Cluster::temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let mut cluster = Cluster::with_config_in(dir, "127.0.0.1", "[[team]]\nname = \"t\"\n");
    cluster.start_agent("n1", 1);
    let me: Value = {
        let output = gpool_command(&["whoami", "--output", "json"])
            .env("GPOOL_SERVER", &cluster.addr)
            .env("USER", "root")
            .env_remove("GPOOL_TOKEN")
            .output()
            .unwrap();
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&output.stderr)))
    };
    assert_eq!(me["via"], "loopback uid");
    assert_eq!(
        me["user"].as_str(),
        Some(crate::harness::cluster::current_user().as_str())
    );
    if nix::unistd::geteuid().is_root() {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
        let them = cluster
            .gpool_as(&nobody, &cluster.addr, &["whoami", "--output", "json"])
            .json();
        assert_eq!(
            (them["user"].as_str(), them["admin"].as_bool(), them["via"].as_str()),
            (Some("nobody"), Some(false), Some("loopback uid"))
        );
    }
}

#[test]
fn config_mode_refuses_plaintext_unless_it_is_allowed_for_the_peer() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpoold.toml");
    std::fs::write(
        &config,
        format!(
            // A documentation address: never bound, even if the check failed.
            "listen = \"192.0.2.1:7070\"\nstate_dir = \"{}\"\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let child = std::process::Command::new(binary("gpoold"))
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let output = crate::harness::process::output_within(child, "gpoold with a bad config", Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("tls: no [tls] table"), "{stderr}");

    // Plaintext allowed for another range only: a loopback client is cut off.
    let mut cluster = Cluster::with_config_in(
        Cluster::temp_dir(),
        "127.0.0.1",
        "insecure_plaintext = true\nplaintext_from = [\"192.0.2.0/24\"]\n",
    );
    let run: Run = gpool_command(&["jobs"])
        .env("GPOOL_SERVER", &cluster.addr)
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 69, "{}", run.stderr);
    cluster.controller().stop();
    let log = std::fs::read_to_string(&cluster.controller.as_ref().unwrap().log).unwrap();
    assert!(
        log.contains("plaintext connection refused: the peer is outside plaintext_from"),
        "{log}"
    );
}
