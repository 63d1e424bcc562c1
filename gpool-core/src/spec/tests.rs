//! Tests for spec parsing and validation: every refusal names its field.

use super::job_file::{parse_in_runs, run_starts, JOBS_PER_PARSE};
use super::*;

fn input(command: &[&str]) -> JobSpecInput {
    JobSpecInput {
        command: Some(CommandInput::Argv(command.iter().map(|s| s.to_string()).collect())),
        ..JobSpecInput::default()
    }
}

#[test]
fn defaults_fill_a_minimal_spec() {
    let spec = input(&["/usr/bin/python3", "train.py"]).into_spec().unwrap();
    assert_eq!(spec.name, "python3");
    assert_eq!((spec.gpus_per_node, spec.nodes), (1, 1));
    assert_eq!(spec.time_limit_secs, None);
    assert!(spec.team.is_empty() && spec.pool.is_empty());
}

#[test]
fn counts_out_of_range_name_the_field() {
    let mut zero_gpus = input(&["true"]);
    zero_gpus.gpus = Some(0);
    assert_eq!(
        zero_gpus.into_spec().unwrap_err().to_string(),
        "gpus: must be at least 1, got 0"
    );
    let mut negative_nodes = input(&["true"]);
    negative_nodes.nodes = Some(-2);
    assert_eq!(negative_nodes.into_spec().unwrap_err().field, "nodes");
    let mut huge = input(&["true"]);
    huge.gpus = Some(5000);
    assert_eq!(
        huge.into_spec().unwrap_err().to_string(),
        "gpus: must be at most 1024, got 5000"
    );
}

#[test]
fn durations_in_slurm_and_suffixed_forms() {
    for (text, secs) in [
        ("30", 1800),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-12", 129_600),
        ("1-00:30", 88_200),
        ("1-00:00:01", 86_401),
        ("90s", 90),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86_400),
    ] {
        assert_eq!(parse_duration(text), Ok(secs), "{text}");
    }
}

#[test]
fn bad_durations_say_why() {
    assert_eq!(parse_duration("-5m").unwrap_err(), "\"-5m\" is negative");
    assert!(parse_duration("0").unwrap_err().contains("zero"));
    assert!(parse_duration("soon").unwrap_err().contains("not a duration"));
    assert!(parse_duration("1:2:3:4").unwrap_err().contains("not a duration"));
    let mut spec = input(&["true"]);
    spec.time = Some("forever".into());
    assert_eq!(spec.into_spec().unwrap_err().field, "time");
}

#[test]
fn reserved_and_malformed_env_names_are_refused() {
    for name in ["GPOOL_JOB_ID", "CUDA_VISIBLE_DEVICES", "1BAD", "A-B", ""] {
        let mut spec = input(&["true"]);
        spec.env = Some([(name.to_string(), "x".to_string())].into());
        let err = spec.into_spec().unwrap_err();
        assert_eq!(err.field, format!("env.{name}"), "{name}");
    }
    assert_eq!(parse_env_assignment("A=b=c").unwrap(), ("A".into(), "b=c".into()));
    assert!(parse_env_assignment("novalue")
        .unwrap_err()
        .to_string()
        .starts_with("env:"));
}

#[test]
fn idents_workdir_and_command_are_checked() {
    let mut spec = input(&["true"]);
    spec.team = Some("ml team".into());
    assert!(spec
        .into_spec()
        .unwrap_err()
        .to_string()
        .starts_with("team: \"ml team\" contains ' '"));
    let mut spec = input(&["true"]);
    spec.workdir = Some("relative/dir".into());
    assert_eq!(spec.into_spec().unwrap_err().field, "workdir");
    assert_eq!(JobSpecInput::default().into_spec().unwrap_err().field, "command");
    assert_eq!(input(&[""]).into_spec().unwrap_err().field, "command");
}

#[test]
fn gpu_type_lists_are_lowercased_and_split() {
    let mut spec = input(&["true"]);
    spec.gpu_type = Some(OneOrMany::One("H100,a100-80gb".into()));
    let models = spec.into_spec().unwrap().gpu_types;
    assert_eq!(models, vec![GpuModel::new("h100"), GpuModel::new("a100-80gb")]);
}

#[test]
fn job_file_with_several_jobs() {
    let text = r#"
[[job]]
name = "prep"
command = "echo hello && sleep 1"
time = "10m"

[[job]]
command = ["python", "train.py"]
gpus = 8
nodes = 2
gpu_type = ["h100"]
env = { EPOCHS = "3" }
"#;
    let specs = parse_job_file("jobs.toml", text).unwrap();
    assert_eq!(specs.len(), 2);
    assert_eq!(specs[0].command, ["/bin/sh", "-c", "echo hello && sleep 1"]);
    assert_eq!(specs[0].time_limit_secs, Some(600));
    assert_eq!(specs[1].name, "python");
    assert_eq!(&*specs[1].env, [("EPOCHS".to_string(), "3".to_string())].as_slice());
}

#[test]
fn job_file_errors_name_file_line_and_field() {
    let syntax = "[[job]]\ncommand = [\"true\"]\ngpus = = 2\n";
    let err = parse_job_file("jobs.toml", syntax).unwrap_err();
    assert_eq!((err.file.as_str(), err.line), ("jobs.toml", Some(3)), "{err}");

    let unknown = "[[job]]\ncommand = [\"true\"]\n\n[[job]]\ncommand = [\"true\"]\ngpuz = 2\n";
    let err = parse_job_file("jobs.toml", unknown).unwrap_err();
    assert!(err.to_string().contains("unknown field `gpuz`"), "{err}");
    assert_eq!(err.line, Some(6), "{err}");

    let invalid = "[[job]]\ncommand = [\"true\"]\n\n[[job]]\ncommand = [\"true\"]\ngpus = 0\n";
    let err = parse_job_file("jobs.toml", invalid).unwrap_err();
    assert_eq!(err.to_string(), "jobs.toml:4: job 2: gpus: must be at least 1, got 0");

    let empty = parse_job_file("jobs.toml", "").unwrap_err();
    assert!(empty.to_string().contains("jobs.toml"), "{empty}");
}

#[test]
fn example_job_file_parses() {
    let text = include_str!("../../../config/jobs.example.toml");
    let specs = parse_job_file("config/jobs.example.toml", text).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(specs.len(), 3);
    assert_eq!(specs[1].total_gpus(), 16);
    assert_eq!(
        specs[2].image,
        "docker.io/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
    );
}

#[test]
fn an_image_is_a_reference_not_a_flag_or_a_shell_word() {
    for bad in ["-v/:/host", "ubuntu latest", "x;rm", &"a".repeat(256)] {
        let mut spec = input(&["true"]);
        spec.image = Some(bad.to_string());
        let err = spec.into_spec().unwrap_err();
        assert_eq!(err.field, "image", "{bad:?}");
    }
    let mut spec = input(&["true"]);
    spec.image = Some("registry.example:5000/ml/train:1.2@sha256:abc".into());
    assert!(spec.into_spec().is_ok());
}

#[test]
fn time_limits_grace_and_checkpoint_signals_are_bounded() {
    let mut long = input(&["true"]);
    long.time = Some("400d".into());
    assert_eq!(
        long.into_spec().unwrap_err().to_string(),
        "time: 400d is more than the longest time limit, 365d"
    );
    let mut signal = input(&["true"]);
    signal.checkpoint_signal = Some("PROF".into());
    assert!(signal
        .into_spec()
        .unwrap_err()
        .to_string()
        .starts_with("checkpoint_signal: \"PROF\" is not a signal name"));
    let mut number = input(&["true"]);
    number.checkpoint_signal = Some("27".into());
    assert_eq!(number.into_spec().unwrap_err().field, "checkpoint_signal");
    let mut ok = input(&["true"]);
    ok.checkpoint_signal = Some("sigusr2".into());
    ok.grace = Some("2m".into());
    let spec = ok.into_spec().unwrap();
    assert_eq!((spec.checkpoint_signal, spec.grace_secs), (Some(12), Some(120)));
}

#[test]
fn durations_print_as_users_write_them() {
    for (secs, text) in [
        (0, "0s"),
        (90, "1m30s"),
        (46_800, "13h"),
        (5_400, "1h30m"),
        (187_200, "2d4h"),
    ] {
        assert_eq!(format_duration(secs), text);
        if secs > 0 {
            assert_eq!(parse_duration(text).ok(), Some(secs), "{text} reads back");
        }
    }
}

#[test]
fn poison_sized_specs_are_refused_naming_the_field_and_limit() {
    let huge = "x".repeat(5 * 1024 * 1024);
    let err = input(&["echo", &huge]).into_spec().unwrap_err();
    assert_eq!(err.field, "command");
    assert!(
        err.reason.contains("argument 1") && err.reason.contains("131072"),
        "{err}"
    );

    let many: Vec<String> = (0..MAX_ARGS + 1).map(|i| i.to_string()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(input(&many).into_spec().unwrap_err().reason.contains("4097 arguments"));

    let mut spec = input(&["true"]);
    spec.env = Some((0..1_000_000).map(|i| (format!("V{i}"), String::new())).collect());
    let err = spec.into_spec().unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.reason.contains("1024")),
        ("env", true),
        "{err}"
    );

    let mut spec = input(&["true"]);
    spec.env = Some((0..8).map(|i| (format!("V{i}"), "y".repeat(100 * 1024))).collect());
    assert!(spec.into_spec().unwrap_err().reason.contains("bytes in all"));

    let mut spec = input(&["true"]);
    spec.env = Some([("N".repeat(300), String::new())].into());
    assert_eq!(spec.into_spec().unwrap_err().field, "env");

    let mut spec = input(&["true"]);
    spec.workdir = Some(format!("/{}", "d".repeat(5000)));
    assert_eq!(spec.into_spec().unwrap_err().field, "workdir");

    // At the limits (exec counts each string's NUL), a spec still fits
    // many times in one message.
    let biggest_arg = "a".repeat(MAX_ARG_BYTES - 1);
    assert!(input(&["echo", &biggest_arg]).into_spec().is_ok());
    let one_more = "a".repeat(MAX_ARG_BYTES);
    assert!(input(&["echo", &one_more]).into_spec().is_err());
}

#[test]
fn the_shell_environment_is_exported_but_for_the_deny_list() {
    let shell = [
        ("PATH", "/home/u/venv/bin:/usr/bin"),
        ("VIRTUAL_ENV", "/home/u/venv"),
        ("GPOOL_TOKEN", "secret"),
        ("CUDA_VISIBLE_DEVICES", "3"),
        ("SSH_AUTH_SOCK", "/tmp/agent"),
        ("BASH_FUNC_x%%", "() { :; }"),
        ("PWD", "/home/u"),
        ("HF_TOKEN", "hf_x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
        ("OPENAI_API_KEY", "x"),
        ("DB_PASSWORD", "x"),
    ]
    .map(|(name, value)| (name.to_string(), value.to_string()));
    let all = Export::default().apply(shell.clone());
    assert_eq!(all.keys().collect::<Vec<_>>(), ["PATH", "VIRTUAL_ENV"]);
    assert!(Export::parse("NONE").unwrap().apply(shell.clone()).is_empty());
    let some = Export::parse("PATH,LR=0.1").unwrap().apply(shell.clone());
    assert_eq!(
        some.into_iter().collect::<Vec<_>>(),
        [
            ("LR".to_string(), "0.1".to_string()),
            ("PATH".to_string(), "/home/u/venv/bin:/usr/bin".to_string())
        ]
    );
    let everything_and = Export::parse("ALL,LR=0.1").unwrap().apply(shell.clone());
    assert_eq!(everything_and.len(), 3);
    // A secret goes only where it is named.
    assert_eq!(Export::parse("ALL,HF_TOKEN").unwrap().apply(shell)["HF_TOKEN"], "hf_x");
    assert_eq!(Export::parse("PATH,,X").unwrap_err().field, "export");
    assert!(Export::parse("GPOOL_TOKEN")
        .unwrap_err()
        .reason
        .contains("set by gpool"));
}

#[test]
fn gpool_lines_at_the_top_of_a_script_are_its_flags() {
    let script = "#!/bin/bash\n# a comment\n#GPOOL --gpus 4 -t 2h\n\n#GPOOL --name 'my job'\n#GPOOLX --nodes 9\necho hi\n#GPOOL --nodes 8\n";
    assert_eq!(
        script_directives(script).unwrap(),
        ["--gpus", "4", "-t", "2h", "--name", "my job"]
    );
    assert_eq!(script_directives("echo hi\n").unwrap(), Vec::<String>::new());
    assert_eq!(
        script_directives("#GPOOL --name \"x\n").unwrap_err(),
        "line 1: a \" quote is not closed"
    );
}

#[test]
fn gpu_memory_counts_as_gpu_makers_do() {
    // An "80GB" H100 has 81,559 MiB: 80G must take it, 100G must not.
    assert_eq!(parse_gpu_memory("80G"), Ok(76_294));
    assert_eq!(parse_gpu_memory("80GB"), Ok(76_294));
    assert_eq!(parse_gpu_memory("100G"), Ok(95_368));
    assert_eq!(parse_gpu_memory("40960M"), Ok(39_063));
    assert_eq!(parse_gpu_memory("1.5T"), Ok(1_430_512));
    assert!(parse_gpu_memory("lots")
        .unwrap_err()
        .contains("\"lots\" is not a GPU memory size"));
    assert!(parse_gpu_memory("0G").is_err());
}

#[test]
fn requirements_parse_from_flags_and_files_and_name_their_field() {
    let mut with = input(&["true"]);
    with.min_gpu_memory = Some("40G".into());
    with.nvlink = Some("required".into());
    with.constraint = Some(OneOrMany::One("rack=r1, switch=s2".into()));
    with.nodelist = Some(OneOrMany::Many(vec!["n1".into(), "n2,n3".into()]));
    with.exclude = Some(OneOrMany::One("n4".into()));
    let spec = with.into_spec().unwrap();
    assert_eq!(spec.requires.min_gpu_memory_mib, 38_147);
    assert_eq!(spec.requires.nvlink, NvlinkNeed::Required);
    assert_eq!(
        spec.requires
            .constraints
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["rack=r1", "switch=s2"]
    );
    assert_eq!(spec.requires.nodelist, ["n1", "n2", "n3"]);
    assert_eq!(spec.requires.exclude, ["n4"]);

    let mut bad = input(&["true"]);
    bad.nvlink = Some("always".into());
    assert_eq!(
        bad.into_spec().unwrap_err().to_string(),
        "nvlink: \"always\" is not required, preferred or any"
    );
    let mut bad = input(&["true"]);
    bad.constraint = Some(OneOrMany::One("rack".into()));
    assert_eq!(
        bad.into_spec().unwrap_err().to_string(),
        "constraint: \"rack\" is not key=value (a node label)"
    );
    let mut bad = input(&["true"]);
    bad.nodelist = Some(OneOrMany::One("n1".into()));
    bad.exclude = Some(OneOrMany::One("n1".into()));
    assert_eq!(
        bad.into_spec().unwrap_err().to_string(),
        "exclude: node n1 is in both nodelist and exclude"
    );
    let mut bad = input(&["true"]);
    bad.nodes = Some(2);
    bad.nodelist = Some(OneOrMany::One("n1".into()));
    assert_eq!(
        bad.into_spec().unwrap_err().to_string(),
        "nodelist: names 1 nodes, fewer than the job's 2 nodes"
    );
    let file =
        "[[job]]\ncommand = \"true\"\nmin_gpu_memory = \"80G\"\nnvlink = \"preferred\"\nnodelist = [\"n1\", \"n2\"]\n";
    let specs = parse_job_file("jobs.toml", file).unwrap();
    assert_eq!(specs[0].requires.nvlink, NvlinkNeed::Preferred);
    assert_eq!(specs[0].requires.nodelist, ["n1", "n2"]);
}

#[test]
fn a_dependency_in_a_job_file_names_the_last_earlier_job_of_that_name() {
    use crate::deps::DepTarget;
    let file = "[[job]]\nname = \"prep\"\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"prep\"\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"train\"\ncommand = [\"true\"]\ndependency = \"afterok:prep\"\n";
    let specs = parse_job_file("jobs.toml", file).unwrap();
    let targets: Vec<DepTarget> = specs[2].dependencies.iter().map(|dep| dep.target).collect();
    assert_eq!(targets, [DepTarget::InRequest(2)]);

    let later = "[[job]]\nname = \"train\"\ncommand = [\"true\"]\ndependency = \"afterok:prep\"\n\n\
                 [[job]]\nname = \"prep\"\ncommand = [\"true\"]\n";
    let err = parse_job_file("jobs.toml", later).unwrap_err();
    assert_eq!(err.line, Some(1), "{err}");
    assert!(
        err.to_string().contains("job 1:") && err.to_string().contains("\"prep\""),
        "{err}"
    );
}

/// A `[[job]]` table of a generated job file: plain, named, depending on
/// an earlier name, with a sub-table, a header with a comment, a
/// multi-line string holding a header line, a bad job, a syntax error.
fn job_table(kind: u8, n: usize) -> String {
    match kind {
        0 => format!("[[job]]\ncommand = [\"true\", \"{n}\"]\n"),
        1 => format!("[[job]]\nname = \"j{}\"\ncommand = \"true\"\n", n % 3),
        2 => format!("[[job]]\ncommand = \"true\"\ndependency = \"afterok:j{}\"\n", n % 3),
        3 => format!("[[job]]\ncommand = \"true\"\n[job.env]\nN = \"{n}\"\n"),
        4 => format!("[[job]] # job {n}\ncommand = \"true\"\n"),
        5 => "[[job]]\ncommand = \"\"\"\necho\n[[job]]\n\"\"\"\n".to_string(),
        6 => "[[job]]\ncommand = \"true\"\ngpus = 0\n".to_string(),
        _ => "[[job]]\ncommand = = \"true\"\n".to_string(),
    }
}

proptest::proptest! {
    #[test]
    fn a_job_file_parsed_in_runs_gives_what_it_gives_parsed_whole(
        kinds in proptest::collection::vec(proptest::prop_oneof![
            8 => 0u8..6,
            1 => 6u8..8,
        ], 1..24),
        per_run in 1usize..5,
    ) {
        let text: String = kinds
            .iter()
            .enumerate()
            .map(|(n, kind)| job_table(*kind, n) + "\n")
            .collect();
        proptest::prop_assert_eq!(
            parse_in_runs("jobs.toml", &text, per_run),
            parse_in_runs("jobs.toml", &text, usize::MAX)
        );
    }
}

#[test]
fn a_large_job_file_is_parsed_in_runs_with_errors_on_the_file_s_lines() {
    let text: String = (0..3 * JOBS_PER_PARSE)
        .map(|n| job_table(if n == 5 { 1 } else { 0 }, n) + "\n")
        .collect();
    assert_eq!(run_starts(&text, JOBS_PER_PARSE).len(), 3);
    let specs = parse_job_file("jobs.toml", &text).expect("parses");
    assert_eq!(specs.len(), 3 * JOBS_PER_PARSE);
    assert_eq!(
        specs[2 * JOBS_PER_PARSE + 7].command,
        ["true", &(2 * JOBS_PER_PARSE + 7).to_string()]
    );
    // Each table before it is 2 lines and a blank one.
    let bad_at = 2 * JOBS_PER_PARSE + 10;
    let with = |kind| -> String {
        (0..3 * JOBS_PER_PARSE)
            .map(|n| job_table(if n == bad_at { kind } else { 0 }, n) + "\n")
            .collect()
    };
    let err = parse_job_file("jobs.toml", &with(6)).expect_err("a bad job");
    assert_eq!(err.line, Some(3 * bad_at + 1), "{err}");
    assert!(err.message.starts_with(&format!("job {}: gpus", bad_at + 1)), "{err}");
    let err = parse_job_file("jobs.toml", &with(7)).expect_err("a syntax error");
    assert_eq!(err.line, Some(3 * bad_at + 2), "{err}");
}

#[test]
fn memory_is_per_node_or_per_gpu_never_both() {
    let with = |mem: Option<&str>, per_gpu: Option<&str>, gpus: i64| JobSpecInput {
        mem: mem.map(str::to_string),
        mem_per_gpu: per_gpu.map(str::to_string),
        gpus: Some(gpus),
        ..input(&["true"])
    };
    assert_eq!(
        with(Some("64G"), None, 4).into_spec().unwrap().mem_bytes,
        Some(64 << 30)
    );
    assert_eq!(
        with(None, Some("16G"), 4).into_spec().unwrap().mem_bytes,
        Some(64 << 30)
    );
    let both = with(Some("64G"), Some("16G"), 4).into_spec().unwrap_err();
    assert!(
        both.to_string()
            .contains("mem_per_gpu: give mem or mem_per_gpu, not both"),
        "{both}"
    );
    let bad = with(None, Some("lots"), 1).into_spec().unwrap_err();
    assert!(bad.to_string().starts_with("mem_per_gpu:"), "{bad}");
    // In a job file too.
    let jobs = parse_job_file(
        "jobs.toml",
        "[[job]]\ncommand = [\"true\"]\ngpus = 2\nmem_per_gpu = \"8G\"\n",
    )
    .unwrap();
    assert_eq!(jobs[0].mem_bytes, Some(16 << 30));
}

#[test]
fn a_job_file_asks_for_a_fraction_of_a_gpu_and_a_gang_of_fractions_is_refused() {
    let text = "[[job]]\ncommand = \"jupyter lab\"\ngpu_mem = \"20G\"\ngpu_share = \"30%\"\n\n[[job]]\ncommand = \"serve\"\ngpu_fraction = \"0.25\"\n";
    let specs = parse_job_file("jobs.toml", text).unwrap();
    let asks: Vec<_> = specs.iter().map(|spec| spec.gpu_share).collect();
    assert_eq!(
        asks,
        [
            Some(crate::share::ShareAsk {
                memory_mib: 20 * 1024,
                fraction_milli: 0,
                compute_pct: 30
            }),
            Some(crate::share::ShareAsk {
                memory_mib: 0,
                fraction_milli: 250,
                compute_pct: 0
            }),
        ]
    );
    let gang = "[[job]]\ncommand = \"true\"\ngpus = 2\ngpu_mem = \"20G\"\n";
    let err = parse_job_file("jobs.toml", gang).unwrap_err().to_string();
    assert!(err.contains("gpu_mem: a fraction is of one GPU on one node"), "{err}");
    let both = "[[job]]\ncommand = \"true\"\ngpu_mem = \"20G\"\ngpu_fraction = \"0.5\"\n";
    let err = parse_job_file("jobs.toml", both).unwrap_err().to_string();
    assert!(
        err.contains("gpu_fraction: give --gpu-mem or --gpu-fraction, not both"),
        "{err}"
    );
}
