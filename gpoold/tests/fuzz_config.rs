//! Fuzzing of gpoold.toml (proptest, bounded): any text is a config or an
//! error naming the file, never a panic.

use gpoold::config::Config;
use proptest::prelude::*;

const VALID: &str = r#"
listen = "127.0.0.1:7070"
state_dir = "/var/lib/gpool"
node_timeout = "30s"
forget_nodes_after = "7d"
max_message_size = "16M"
admins = ["root"]

[[pool]]
name = "default"

[sharing]
max_user_priority = 100

[[team]]
name = "nlp"
guaranteed_gpus = 8
members = ["alice"]

[[qos]]
name = "high"
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn any_text_is_a_config_or_refused(text in "\\PC{0,400}") {
        let _ = Config::parse("gpoold.toml", &text);
    }

    #[test]
    fn mutated_configs_are_configs_or_refused(
        edits in proptest::collection::vec((any::<usize>(), "[\\[\\]{}=\"',.:0-9a-z\\n -]{0,3}"), 1..6),
    ) {
        let text = gpool_core::testing::insert_edits(VALID, &edits);
        if let Err(err) = Config::parse("gpoold.toml", &text) {
            prop_assert!(err.to_string().contains("gpoold.toml"), "{}", err);
        }
    }
}
