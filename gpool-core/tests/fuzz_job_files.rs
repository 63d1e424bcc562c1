//! Fuzzing of job files (proptest, bounded): any text parses to specs or to
//! an error naming the file, never a panic.

use gpool_core::spec::parse_job_file;
use proptest::prelude::*;

const VALID: &str = r#"
[[job]]
name = "train"
command = ["python", "train.py", "--lr", "0.1"]
gpus = 2
nodes = 1
time = "1:30:00"
team = "nlp"
env = { A = "1", B = "two" }
checkpoint_signal = "USR1"
grace = "2m"
mem = "64G"

[[job]]
command = "echo hi"
gpu_type = ["h100", "a100"]
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn any_text_parses_or_is_refused(text in "\\PC{0,400}") {
        let _ = parse_job_file("fuzz.toml", &text);
    }

    #[test]
    fn mutated_job_files_parse_or_are_refused(
        edits in proptest::collection::vec((any::<usize>(), "[\\[\\]{}=\"',.:0-9a-z\\n -]{0,3}"), 1..6),
    ) {
        let text = gpool_core::testing::insert_edits(VALID, &edits);
        match parse_job_file("fuzz.toml", &text) {
            Ok(specs) => {
                for spec in specs {
                    prop_assert!(spec.validate().is_ok());
                }
            }
            Err(err) => prop_assert!(err.to_string().starts_with("fuzz.toml")),
        }
    }
}
