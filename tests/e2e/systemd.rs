//! The systemd units pass `systemd-analyze verify`, with ExecStart pointing
//! at the binaries this build made.

use crate::harness::process::{binary, output_within};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn units_verify() {
    let units_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd");
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = binary("gpoold").parent().expect("bin dir").display().to_string();
    let mut paths = Vec::new();
    for unit in ["gpoold.service", "gpool-agent.service"] {
        let text = std::fs::read_to_string(units_dir.join(unit)).expect("unit file");
        assert!(
            text.contains("ExecStart=/usr/local/bin/"),
            "{unit} starts the installed binary"
        );
        if unit == "gpool-agent.service" {
            assert!(text.contains("KillMode=process"), "agent restarts must not kill jobs");
            assert!(
                text.contains("Delegate=yes") && text.contains("DelegateSubgroup=agent"),
                "the agent owns its subtree, and is started in its leaf"
            );
        }
        let path = dir.path().join(unit);
        std::fs::write(&path, text.replace("/usr/local/bin", &bin_dir)).unwrap();
        paths.push(path);
    }
    let child = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-analyze (Debian package systemd) is installed");
    let output = output_within(child, "systemd-analyze verify", Duration::from_secs(60));
    // A systemd older than 254 does not know DelegateSubgroup= (the agent
    // then says that limits are not enforced): its note alone is allowed.
    let stderr: String = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| {
            !line.contains("Unknown key 'DelegateSubgroup'") && !line.contains("Unknown key name 'DelegateSubgroup'")
        })
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(
        output.status.success() && !stderr.contains(".service:"),
        "systemd-analyze verify:\n{stderr}"
    );
}
