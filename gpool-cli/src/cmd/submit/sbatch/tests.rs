use super::*;

fn utc(at: time::PrimitiveDateTime) -> Option<i64> {
    Some(at.assume_utc().unix_timestamp())
}

fn context(ignore: &[&str]) -> Context<'static> {
    Context {
        ignore: ignore.iter().map(|name| name.to_string()).collect(),
        cwd: "/home/ada",
        local_to_utc: &utc,
    }
}

/// The gpool flags of a script with these `#SBATCH` lines.
fn flags_of(lines: &[&str]) -> Result<Vec<String>, String> {
    let text: String = std::iter::once("#!/bin/bash".to_string())
        .chain(lines.iter().map(|line| format!("#SBATCH {line}")))
        .chain(std::iter::once("srun python train.py".to_string()))
        .map(|line| line + "\n")
        .collect();
    read("train.sh", &text, &context(&[]))
        .map(|read| under_later_layers(&read, &[]))
        .map_err(|refusal| refusal.to_string())
}

fn flags(line: &str) -> String {
    flags_of(&[line])
        .unwrap_or_else(|err| panic!("{line}: {err}"))
        .join(" ")
}

fn refused(line: &str) -> String {
    match flags_of(&[line]) {
        Ok(flags) => panic!("{line} was taken as {flags:?}"),
        Err(err) => err,
    }
}

#[test]
fn maps_each_option_to_gpool_flag() {
    let cases = [
        ("-J train", "--name=train"),
        ("--job-name='my job'", "--name=my job"),
        ("-N 2", "--nodes=2"),
        ("--nodes=4-4", "--nodes=4"),
        ("--gres=gpu:4", "--gres=gpu:4"),
        ("--gres=gpu:h100:2", "--gres=gpu:h100:2"),
        ("--gres gpu", "--gres=gpu"),
        ("-G 8", "--gpus=8"),
        ("-Ga100:8", "--gpus=a100:8"),
        ("--gpus-per-node=h100:4", "--gpus-per-node=h100:4"),
        ("--gpus-per-task=2", "--gpus-per-node=2"),
        ("--array=0-9%3", "--array=0-9%3"),
        ("-a 1,3,5-9", "--array=1,3,5-9"),
        ("-p gpu", "--pool=gpu"),
        ("--partition=batch", "--pool=batch"),
        ("-A vision", "--team=vision"),
        ("-q high", "--qos=high"),
        ("-c 16", "--cpus-per-task=16"),
        ("--cpus-per-gpu=8", "--cpus-per-gpu=8"),
        ("--mem=64G", "--mem=64G"),
        ("--mem=4000", "--mem=4000M"),
        ("--mem-per-gpu=16G", "--mem-per-gpu=16G"),
        ("-D /scratch/run", "--workdir=/scratch/run"),
        ("--chdir=runs/a", "--workdir=/home/ada/runs/a"),
        ("-d afterok:12:13,afterany:14", "--dependency=afterok:12:13,afterany:14"),
        ("--dependency=singleton", "--dependency=singleton"),
        ("--exclusive", "--exclusive"),
        ("-w n[1-3],gpu-[01-02,07]", "--nodelist=n1,n2,n3,gpu-01,gpu-02,gpu-07"),
        ("-x n4", "--exclude=n4"),
        ("-C a100&ib", "--constraint=a100=true,ib=true"),
        ("--constraint=rack=r1", "--constraint=rack=r1"),
        ("--requeue", ""),
        ("--no-requeue", "--no-requeue"),
        ("--signal=USR1@90", "--checkpoint-signal=USR1 --grace=90s"),
        ("--signal=SIGTERM", "--checkpoint-signal=SIGTERM --grace=60s"),
        ("-H", "--hold"),
        ("--hold", "--hold"),
        ("--export=NONE", "--export=NONE"),
        ("--export=NIL", "--export=NONE"),
        ("--export=ALL,SEED=7", "--export=ALL,SEED=7"),
        ("-n 1", ""),
        ("-n 4", "--ntasks-per-node=4"),
        ("--ntasks-per-node=1", "--ntasks-per-node=1"),
        ("--ntasks-per-node=8", "--ntasks-per-node=8"),
        ("-o out-%A_%a.log", "--stdout=out-%A_%a.log"),
        ("-e %x-%j.err", "--stderr=%x-%j.err"),
        ("--time=2:00:00 # two hours", "--time=2:00:00"),
    ];
    for (line, expected) in cases {
        assert_eq!(flags(line), expected, "#SBATCH {line}");
    }
}

#[test]
fn reads_every_slurm_time_form() {
    for form in ["30", "30:15", "2:00:00", "1-12", "1-12:30", "1-12:30:15", "0:10:00"] {
        assert_eq!(flags(&format!("-t {form}")), format!("--time={form}"));
        assert_eq!(flags(&format!("--time={form}")), format!("--time={form}"));
    }
    for (form, secs) in [
        ("30", 1800),
        ("30:15", 1815),
        ("2:00:00", 7200),
        ("1-12", 129_600),
        ("1-12:30", 131_400),
    ] {
        assert_eq!(gpool_core::spec::parse_duration(form), Ok(secs), "{form}");
    }
    assert!(refused("-t UNLIMITED").contains("no unlimited time limit"));
    assert!(refused("--time=0").contains("no unlimited time limit"));
    assert!(refused("--time=1:2:3:4").contains("not a duration"));
}

#[test]
fn maps_output_pattern_letters_and_refuses_those_without_one() {
    assert_eq!(flags("-o %x_%j_%u.out"), "--stdout=%x_%j_%u.out");
    assert_eq!(flags("-o log-%N-%n-%t.%%"), "--stdout=log-%n-%t-%t.%%");
    assert!(refused("-o slurm-%J.out").contains("%J and %s name a job step"));
    assert!(refused("-e err-%s").contains("has no steps"));
    assert!(refused("-o x-%4a.out").contains("does not pad"));
    assert!(refused("-o x-%b.out").contains("%b"));
    assert!(refused("-o x-%q.out").contains("%q is not one of the pattern letters"));
    assert!(refused("-o x\\%j.out").contains("backslash"));
}

#[test]
fn a_refusal_names_file_line_directive_and_reason() {
    let script = "#!/bin/bash\n# a comment\n#SBATCH -J train\n\n#SBATCH --gres=nvme:1 -t 10\npython train.py\n";
    let refusal = read("train.sh", script, &context(&[])).unwrap_err();
    assert_eq!(refusal.line, 5);
    assert_eq!(refusal.directive, "--gres=nvme:1");
    assert_eq!(
        refusal.to_string(),
        "train.sh:5: #SBATCH --gres=nvme:1: \"nvme:1\": gpool schedules GPUs only: give gpu:N, gpu:MODEL:N or mps:PERCENT"
    );
    assert_eq!(
        refused("--licenses=matlab:1"),
        "train.sh:2: #SBATCH --licenses=matlab:1: --licenses: gpool has no equivalent it can honour; remove the line, or pass it over by listing it in GPOOL_SBATCH_IGNORE"
    );
    assert!(refused("--mem-per-cpu 4G")
        .starts_with("train.sh:2: #SBATCH --mem-per-cpu 4G: --mem-per-cpu: gpool limits memory"));
    assert!(flags_of(&["-N 2", "-n 3"])
        .unwrap_err()
        .contains("#SBATCH -n 3: gpool runs the same number of tasks on each node, and 3 tasks do not make 1 on each of 2 node(s)"));
    assert!(flags_of(&["-N 2", "--ntasks-per-node=2", "-n 6"])
        .unwrap_err()
        .contains("6 tasks do not make 2 on each of 2"));
    assert!(refused("--exclusive=user").contains("no sharing by user"));
    assert!(refused("-N 2-4").contains("range of node counts"));
    assert!(refused("--mem=0").contains("all of a node's memory"));
    assert!(refused("-p a,b").contains("a list of partitions"));
    assert!(refused("-G a100:2,v100:2").contains("one kind of GPU"));
    assert!(refused("-d after:12").contains("never for a job's start"));
    assert!(refused("-d afterok:12?afterok:13").contains("any one dependency"));
    assert!(refused("-C a100|h100").contains("no OR"));
    assert!(refused("--signal=B:USR1@60").contains("never the batch shell alone"));
    assert!(refused("-w /etc/hosts.txt").contains("a file of node names"));
    assert!(refused("--mail-type=TIME_LIMIT_90 --mail-user=a@b").contains("TIME_LIMIT_90"));
    assert!(refused("--mail-type=END").contains("add --mail-user"));
    assert!(refused("--mail-user=ada --mail-type=END").contains("NAME@HOST"));
    assert!(refused("-J").contains("--job-name lacks its value"));
    assert!(refused("--hold=yes").contains("--hold takes no value"));
    assert!(refused("gpu:4").contains("is not an option"));
    assert!(refused("--job-name=\"x").contains("quote is not closed"));
}

#[test]
fn reads_the_leading_comment_block_only_as_sbatch_does() {
    let script =
        "#!/bin/bash\n#SBATCH -N 2\n##SBATCH -N 9\n#SBATCHX -N 8\n  #SBATCH -J x\necho hi\n#SBATCH --licenses=x\n";
    let flags = read("s.sh", script, &context(&[])).unwrap();
    assert_eq!(under_later_layers(&flags, &[]), ["--nodes=2", "--name=x"]);
}

#[test]
fn the_last_of_one_option_wins_and_two_ways_of_one_request_are_refused() {
    assert_eq!(flags_of(&["-t 10", "--time=20"]).unwrap(), ["--time=20"]);
    assert_eq!(flags_of(&["--no-requeue", "--requeue"]).unwrap(), Vec::<String>::new());
    assert_eq!(flags_of(&["--gres=gpu:2", "--gres=gpu:4"]).unwrap(), ["--gres=gpu:4"]);
    let err = flags_of(&["--gres=gpu:2", "-G 4"]).unwrap_err();
    assert_eq!(
        err,
        "train.sh:3: #SBATCH -G 4: line 2 asks for the same with --gres: give it once, one way"
    );
    assert!(flags_of(&["--mem=4G", "--mem-per-gpu=1G"])
        .unwrap_err()
        .contains("--mem"));
    assert_eq!(flags_of(&["-N 2", "-n 2"]).unwrap(), ["--nodes=2"]);
}

#[test]
fn mail_lines_become_one_notify() {
    assert_eq!(
        flags_of(&["--mail-type=END,FAIL", "--mail-user=ada@example.com"]).unwrap(),
        ["--notify=mail:ada@example.com", "--notify-on=end,fail"]
    );
    assert_eq!(
        flags_of(&["--mail-user=ada@example.com", "--mail-type=BEGIN"]).unwrap(),
        ["--notify=mail:ada@example.com", "--notify-on=start"]
    );
    assert_eq!(
        flags_of(&["--mail-type=ALL", "--mail-user=a@b"]).unwrap()[1],
        "--notify-on=all"
    );
    // As sbatch: an address alone, or NONE, mails nothing.
    assert_eq!(flags_of(&["--mail-user=a@b"]).unwrap(), Vec::<String>::new());
    assert_eq!(flags_of(&["--mail-type=NONE"]).unwrap(), Vec::<String>::new());
}

#[test]
fn begin_times_become_gpool_forms() {
    assert_eq!(flags("--begin=now"), "--begin=now");
    assert_eq!(flags("--begin=now+60"), "--begin=now+60s");
    assert_eq!(flags("--begin=now+2hours"), "--begin=now+7200s");
    assert_eq!(flags("-b now+1day"), "--begin=now+86400s");
    assert_eq!(flags("--begin=2026-11-28"), "--begin=2026-11-28T00:00:00Z");
    assert_eq!(flags("--begin=2026-11-28T16:00"), "--begin=2026-11-28T16:00:00Z");
    assert_eq!(flags("--begin=2026-11-28T16:00:30"), "--begin=2026-11-28T16:00:30Z");
    assert!(refused("--begin=teatime").contains("YYYY-MM-DD"));
    assert!(refused("--begin=now+3fortnights").contains("not a unit of time"));
    // Local time: an hour east of UTC is an hour earlier in UTC.
    let east = |at: time::PrimitiveDateTime| Some(at.assume_utc().unix_timestamp() - 3600);
    assert_eq!(
        values::begin("2026-11-28T16:00", &east),
        Ok("2026-11-28T15:00:00Z".into())
    );
}

#[test]
fn ignored_directives_are_passed_over_and_said() {
    let script =
        "#!/bin/sh\n#SBATCH --comment='a note' -J x\n#SBATCH --licenses=matlab:1 --mail-type=END\n#SBATCH -v\n";
    let flags = read("s.sh", script, &context(&["--licenses", " --mail-type"])).unwrap();
    assert_eq!(under_later_layers(&flags, &[]), ["--name=x"]);
    assert_eq!(
        flags.ignored,
        [
            "s.sh:2: #SBATCH --comment=a note passed over: it changes nothing of where or how a gpool job runs",
            "s.sh:3: #SBATCH --licenses=matlab:1 passed over: listed in GPOOL_SBATCH_IGNORE",
            "s.sh:3: #SBATCH --mail-type=END passed over: listed in GPOOL_SBATCH_IGNORE",
            "s.sh:4: #SBATCH -v passed over: it changes nothing of where or how a gpool job runs",
        ]
    );
    // A short name on the list passes over its long form too; an unknown
    // option's value is the next word unless that is an option.
    let script = "#SBATCH --account=vision --wckey ml -J y\n";
    let flags = read("s.sh", script, &context(&["-A", "--wckey"])).unwrap();
    assert_eq!(under_later_layers(&flags, &[]), ["--name=y"]);
}

#[test]
fn later_layers_drop_what_they_set() {
    let flags = read("s.sh", "#SBATCH --gres=gpu:2 -t 10 --mem=4G -c 8\n", &context(&[])).unwrap();
    let later = ["gpus".to_string(), "mem_per_gpu".to_string()];
    assert_eq!(under_later_layers(&flags, &later), ["--time=10", "--cpus-per-task=8"]);
}

/// `#SBATCH` first, `#GPOOL` over it, the command line over both.
#[test]
fn script_lines_and_command_line_layer_in_slurm_order() {
    let dir = std::env::temp_dir().join(format!("gpool-sbatch-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\n#SBATCH -J slurm -t 10 --gres=gpu:2 -N 2 -c 8 -p batch\n#GPOOL --name gpool -G 8\necho hi\n",
    )
    .unwrap();
    let script = script.display().to_string();
    let argv: Vec<String> = ["gpool", "submit", "-t", "20", "--mem-per-gpu", "1G", &script]
        .iter()
        .map(|word| word.to_string())
        .collect();
    let with = crate::cmd::submit::with_script_directives(argv, &script).unwrap();
    let cli = <crate::Cli as clap::Parser>::try_parse_from(&with).unwrap();
    let crate::Command::Submit(args) = cli.command else {
        panic!("not submit: {with:?}");
    };
    assert_eq!(args.name.as_deref(), Some("gpool"));
    assert_eq!(args.time.as_deref(), Some("20"));
    assert!(args.gres.is_none(), "#GPOOL -G drops #SBATCH --gres: {with:?}");
    assert_eq!(args.gpus.as_ref().map(|gpus| gpus.count), Some(8));
    assert_eq!(args.nodes, Some(2));
    assert_eq!(args.cpus_per_task, Some(8));
    assert_eq!(args.pool.as_deref(), Some("batch"));
    assert_eq!(args.mem_per_gpu.as_deref(), Some("1G"));
    let mut args = args;
    args.script = true;
    let input = crate::cmd::submit::input_from_flags(*args).unwrap();
    // 8 CPUs on a node of 4 GPUs (8 over 2 nodes): 2 per GPU.
    assert_eq!((input.gpus, input.cpus_per_gpu), (Some(4), Some(2)));
    std::fs::remove_dir_all(&dir).unwrap();
}
