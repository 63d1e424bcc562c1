//! Fuzzing of agent.toml (proptest, bounded): any text is a config or an
//! error naming the file, never a panic.

use gpool_agent::config::AgentConfig;
use proptest::prelude::*;

const VALID: &str = r#"
controller = "https://ctl.example:7070"
node_name = "n1"
spool_dir = "/var/spool/gpool"
heartbeat_interval = "1s"
ca = "/etc/gpool/ca.pem"
cert = "/etc/gpool/n1.pem"
key = "/etc/gpool/n1.key"

[labels]
rack = "r1"

[[simulated_gpu]]
model = "h100"
memory_mib = 81559
count = 8
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn any_text_is_a_config_or_refused(text in "\\PC{0,400}") {
        let _ = AgentConfig::parse("agent.toml", &text);
    }

    #[test]
    fn mutated_configs_are_configs_or_refused(
        edits in proptest::collection::vec((any::<usize>(), "[\\[\\]{}=\"',.:0-9a-z\\n -]{0,3}"), 1..6),
    ) {
        let text = gpool_core::testing::insert_edits(VALID, &edits);
        if let Err(err) = AgentConfig::parse("agent.toml", &text) {
            prop_assert!(err.to_string().contains("agent.toml"), "{}", err);
        }
    }
}
