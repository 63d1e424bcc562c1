//! `gpool submit`: one job from flags, or every `[[job]]` of a file.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_core::spec::gpus::GpuRequest;
use gpool_core::spec::{parse_env_assignment, parse_job_file, CommandInput, JobSpecInput, OneOrMany};
use gpool_core::JobSpec;
use std::path::PathBuf;

mod gpus;
mod hints;
pub mod sbatch;
mod share;

pub use hints::{check_script, output_file_hint, unknown_flag, unknown_script_flag};

/// Exit code of `--wait` when a job failed: it exited non-zero, a signal
/// ended it, it never started, its node was lost or it ran out of memory.
/// (`--attach` exits with the job's own code instead, as srun does.)
pub const EXIT_FAILED: u8 = 3;
/// Exit code of `--wait` when a job ran out of time (as `timeout(1)`).
pub const EXIT_TIMEOUT: u8 = 124;
/// Exit code of `--wait` when a job was cancelled.
pub const EXIT_CANCELLED: u8 = 125;
/// Exit code of `--wait` when the user stopped waiting (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

#[derive(clap::Args)]
// A flag given twice (in a script's #GPOOL line, then on the command line)
// takes the later value.
#[command(args_override_self = true)]
pub struct SubmitArgs {
    /// The job's GPUs, all its nodes together (as Slurm's -G): N or MODEL:N
    /// (h100:8); with -N, each node gets an equal share.
    #[arg(long, short = 'G', value_name = "[MODEL:]N", allow_hyphen_values = true, value_parser = GpuRequest::parse)]
    gpus: Option<GpuRequest>,
    /// GPUs on each node: N or MODEL:N.
    #[arg(long, value_name = "[MODEL:]N", allow_hyphen_values = true, value_parser = GpuRequest::parse, conflicts_with = "gpus")]
    gpus_per_node: Option<GpuRequest>,
    /// Slurm's generic resources, GPUs only: gpu:N or gpu:MODEL:N per node,
    /// or mps:PERCENT, that part of one GPU (--gpu-fraction, --gpu-share).
    #[arg(long, value_name = "gpu[:MODEL]:N", value_parser = GpuRequest::parse_gres, conflicts_with_all = ["gpus", "gpus_per_node"])]
    gres: Option<GpuRequest>,
    /// Nodes (a gang: all start together or none does).
    #[arg(long, short = 'N', allow_negative_numbers = true)]
    nodes: Option<i64>,
    /// Acceptable GPU models, comma-separated (h100,a100-80gb).
    #[arg(long)]
    gpu_type: Option<String>,
    /// The job's name (default: its program's name).
    #[arg(long, short = 'J')]
    pub name: Option<String>,
    /// The team it runs for (its guarantee and its fair share).
    #[arg(long)]
    team: Option<String>,
    /// The project its GPU-hours are charged to.
    #[arg(long)]
    project: Option<String>,
    /// Its kind of work (training, inference, ...), for reports.
    #[arg(long)]
    workload_type: Option<String>,
    /// Time limit: 30 (minutes), 90s, 2h, 1h30m, 2:00:00, 1-12:00:00.
    #[arg(long, short = 't', allow_hyphen_values = true)]
    time: Option<String>,
    /// Environment variable for the job (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Working directory (default: the current directory).
    #[arg(long)]
    workdir: Option<String>,
    /// Priority among its team's jobs (higher first; up to max_user_priority).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Pool (partition); the default pool when absent.
    #[arg(long, short = 'p')]
    pool: Option<String>,
    /// Fail instead of requeueing when the job's node is lost.
    #[arg(long)]
    no_requeue: bool,
    /// Send the job's stdout and stderr to /dev/null (no `gpool logs`).
    #[arg(long)]
    discard_output: bool,
    /// QoS class (the default class when absent).
    #[arg(long, short = 'q')]
    qos: Option<String>,
    /// Signal sent when the job is preempted, to checkpoint (default USR1).
    #[arg(long, value_name = "SIGNAL")]
    checkpoint_signal: Option<String>,
    /// Time between the checkpoint signal and the kill (default: the QoS's).
    #[arg(long, value_name = "DURATION")]
    grace: Option<String>,
    /// Run the command in a container of this OCI image (the node's
    /// container runtime: podman or docker).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// Memory limit on each node (64G, 512M): the job's cgroup's.
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
    /// Memory limit per GPU (16G): times its GPUs on each node, instead
    /// of --mem (as Slurm's).
    #[arg(long, value_name = "SIZE", conflicts_with = "mem")]
    mem_per_gpu: Option<String>,
    /// The most its stdout or stderr may hold on a node (10G, 500M); past
    /// it the job is ended. The node's max_output caps it too.
    #[arg(long, value_name = "SIZE")]
    max_output: Option<String>,
    /// CPUs for each of the job's GPUs (a CPU quota in its cgroup).
    #[arg(long, value_name = "N")]
    cpus_per_gpu: Option<i64>,
    /// CPUs on each node, as Slurm's -c (gpool runs one task per node):
    /// shared among the node's GPUs as --cpus-per-gpu, rounded up.
    #[arg(long, value_name = "N", conflicts_with = "cpus_per_gpu")]
    cpus_per_task: Option<i64>,
    /// Its nodes run nothing else: it waits for idle nodes and takes every
    /// GPU of each (GPU-hours are charged for them all), as Slurm's.
    #[arg(long)]
    exclusive: bool,
    #[command(flatten)]
    share: share::ShareArgs,
    /// Jobs to wait for: afterok:ID[:ID...] (completed), afterany:ID (ended),
    /// afternotok:ID (ended without completing), singleton (no other job
    /// of yours with this name runs), comma-separated. A job whose
    /// dependency can never be met fails with that reason.
    #[arg(long, short = 'd', value_name = "LIST")]
    dependency: Option<String>,
    /// A job array: task indices 0-999, 1,3,5-9 or 0-99:10, with %N to run
    /// at most N tasks at once. Each task gets GPOOL_ARRAY_TASK_ID and
    /// GPOOL_ARRAY_JOB_ID; `gpool jobs` lists the waiting ones as one line.
    #[arg(long, short = 'a', value_name = "INDICES")]
    array: Option<String>,
    /// Write the job's stdout to this file instead of the node's spool
    /// (then `gpool logs` does not show it): %j job id, %A array id, %a
    /// task index, %n node, %t rank, %u user, %x job name; relative to the
    /// workdir. Opened by the job's user on its node.
    #[arg(long = "stdout", short = 'o', value_name = "PATTERN")]
    stdout: Option<String>,
    /// The same for its stderr.
    #[arg(long = "stderr", short = 'e', value_name = "PATTERN")]
    stderr: Option<String>,
    /// Only GPUs with at least this much memory: 40G, 80G (decimal, as GPU
    /// makers count: 80G takes an 80 GB H100).
    #[arg(long, value_name = "SIZE")]
    min_gpu_memory: Option<String>,
    /// required: only GPUs all joined by NVLink; preferred: those where
    /// some are free; any (default).
    #[arg(long, value_name = "required|preferred|any", value_parser = ["required", "preferred", "any"])]
    nvlink: Option<String>,
    /// Node labels that must all match: key=value[,key=value].
    #[arg(long, short = 'C', value_name = "K=V,...")]
    constraint: Option<String>,
    /// Only these nodes: NODE[,NODE...] (-w, as Slurm's).
    #[arg(long, short = 'w', value_name = "NODES")]
    nodelist: Option<String>,
    /// Never these nodes: NODE[,NODE...] (-x, as Slurm's).
    #[arg(long, short = 'x', value_name = "NODES")]
    exclude: Option<String>,
    /// Run in this reservation (`[[reservation]]` of gpoold.toml): only on
    /// its nodes, only while it is open.
    #[arg(long, value_name = "NAME")]
    reservation: Option<String>,
    /// Not before: now+1h, 30m (after submission), 2026-11-28 or
    /// 2026-11-28T16:00 (UTC), as Slurm's --begin.
    #[arg(long, short = 'b', value_name = "TIME")]
    begin: Option<String>,
    /// Say when the job starts or ends: a webhook (https://..., a JSON POST)
    /// or a mailbox (mail:ADDR), as the pool's gpoold.toml allows.
    #[arg(long, value_name = "URL|mail:ADDR")]
    notify: Option<String>,
    /// On which events: start, end, fail, all (comma-separated; default end).
    #[arg(long, value_name = "EVENTS", requires = "notify")]
    notify_on: Option<String>,
    /// Submit every [[job]] of this TOML file in one request.
    #[arg(
        short = 'f',
        long = "file",
        conflicts_with_all = [
            "command", "gpus", "gpus_per_node", "gres", "nodes", "gpu_type", "name", "team", "project", "workload_type",
            "time", "env", "workdir", "priority", "pool", "no_requeue",
            "discard_output", "qos", "checkpoint_signal", "grace", "image", "mem", "mem_per_gpu", "cpus_per_gpu", "cpus_per_task", "exclusive",
            "dependency", "array", "stdout", "stderr", "min_gpu_memory", "nvlink", "constraint",
            "nodelist", "exclude", "max_output", "notify", "notify_on", "begin", "reservation",
            "gpu_mem", "gpu_fraction", "gpu_share",
        ]
    )]
    file: Option<PathBuf>,
    /// Which of this shell's variables the job gets: ALL (the default, but
    /// gpool's own, CUDA_VISIBLE_DEVICES, SSH_* and the terminal's), NONE,
    /// or NAME[,NAME=VALUE...] (only those; ALL,... for all and those).
    /// --env and a job file's env win. Container jobs get only named ones;
    /// a job file's jobs (-f) none unless --export is given.
    #[arg(long, value_name = "ALL|NONE|NAMES", value_parser = parse_export)]
    export: Option<gpool_core::spec::Export>,
    /// Follow the jobs until they end: exit 0 when all completed, else 3
    /// (failed), 124 (timeout) or 125 (cancelled) for the first one that
    /// did not; with --output json, a summary of every job on stdout.
    #[arg(long)]
    wait: bool,
    /// With --wait: the first job that does not complete cancels the rest.
    #[arg(long, requires = "wait")]
    fail_fast: bool,
    /// As --wait, printing the job's stdout as it runs (the id goes to
    /// stderr), and exiting with the job's own code, as srun; one job only.
    #[arg(long, conflicts_with = "file")]
    pub attach: bool,
    /// Run on a terminal of its own on the node, relayed to this one until
    /// it ends (as srun --pty), and exit with its code. Not requeued.
    #[arg(long, conflicts_with_all = ["file", "array", "stdout", "stderr", "discard_output", "image"])]
    pub pty: bool,
    /// Submit it held (as sbatch's -H): it is not scheduled until `gpool
    /// release ID`.
    #[arg(long, short = 'H', conflicts_with_all = ["attach", "pty"])]
    pub hold: bool,
    /// Tasks on each node (as sbatch's): `srun` inside the job starts them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub ntasks_per_node: Option<u32>,
    /// Run this shell command line (with `sh -c`), as sbatch's --wrap;
    /// the job is named `wrap` unless -J names it.
    #[arg(long, value_name = "CMD", conflicts_with_all = ["command", "file"])]
    pub wrap: Option<String>,
    /// `-- CMD ARGS...`: the command to run. Without `--`: a batch script
    /// and its arguments, whose `#SBATCH` lines (as sbatch reads them),
    /// then `#GPOOL` lines give flags (the command line's win).
    #[arg(value_name = "CMD", trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
    /// Set when the command is a batch script (no `--` before it).
    #[arg(skip)]
    pub script: bool,
}

/// The most a job file or batch script may hold: what one request to
/// gpoold may carry (a larger one is refused at once, not read whole).
const MAX_FILE_BYTES: u64 = gpool_proto::DEFAULT_MAX_MESSAGE_BYTES as u64;

/// Reads a job file or script of at most `MAX_FILE_BYTES` (`/dev/zero`
/// too is read only that far).
fn read_bounded(path: &std::path::Path) -> Result<String, CliError> {
    use std::io::Read;
    let cannot = |err: std::io::Error| CliError::Usage(format!("{}: cannot read: {err}", path.display()));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "{}: larger than {} MiB, the most one submission may carry; split it into several files",
            path.display(),
            MAX_FILE_BYTES / (1024 * 1024)
        )));
    }
    String::from_utf8(bytes).map_err(|err| CliError::Usage(format!("{}: not UTF-8 text: {err}", path.display())))
}

/// The command line of `gpool submit SCRIPT ARGS...` with the script's
/// `#SBATCH` flags, then its `#GPOOL` flags, inserted right after `submit`:
/// the later win (a flag the `#GPOOL` lines or the command line give drops
/// the `#SBATCH` line that asked the same), as sbatch's own order.
pub fn with_script_directives(argv: Vec<String>, script: &str) -> Result<Vec<String>, CliError> {
    let text = read_bounded(std::path::Path::new(script))?;
    let directives =
        gpool_core::spec::script_directives(&text).map_err(|reason| CliError::Usage(format!("{script}: {reason}")))?;
    check_gpool_lines(script, &directives)?;
    let at = argv
        .iter()
        .position(|arg| arg == "submit")
        .map_or(argv.len(), |position| position + 1);
    let mut with = argv;
    with.splice(at..at, directives);
    let sbatch = read_sbatch_lines(script, &text)?;
    for line in &sbatch.ignored {
        eprintln!("gpool: {line}");
    }
    let sbatch_flags = sbatch::under_later_layers(&sbatch, &fields_given(&with));
    with.splice(at..at, sbatch_flags);
    Ok(with)
}

/// A script says how its job runs, never where gpool sends it (or the
/// caller's token and environment) nor how gpool prints.
fn check_gpool_lines(script: &str, directives: &[String]) -> Result<(), CliError> {
    let Some(global) = directives.iter().find(|word| {
        ["--server", "--timeout", "--output"]
            .iter()
            .any(|flag| *word == flag || word.starts_with(&format!("{flag}=")))
    }) else {
        return Ok(());
    };
    // `#SBATCH --output=slurm-%j.out` is Slurm's most common line.
    let hint = if global.starts_with("--output") {
        "; gpool's flag for the job's output file is --stdout (-o)"
    } else {
        ""
    };
    Err(CliError::Usage(format!(
        "{script}: #GPOOL lines hold submit flags only; {global} is not one{hint}"
    )))
}

/// The script's `#SBATCH` lines as gpool flags, or the first one gpool
/// cannot honour.
pub(crate) fn read_sbatch_lines(script: &str, text: &str) -> Result<sbatch::SbatchFlags, CliError> {
    let cwd = std::env::current_dir()
        .map(|dir| dir.display().to_string())
        .unwrap_or_default();
    let context = sbatch::Context {
        ignore: std::env::var(sbatch::IGNORE_VAR)
            .unwrap_or_default()
            .split(',')
            .filter(|name| !name.trim().is_empty())
            .map(String::from)
            .collect(),
        cwd: &cwd,
        local_to_utc: &sbatch::local_to_utc,
    };
    sbatch::read(script, text, &context).map_err(|refusal| CliError::Usage(refusal.to_string()))
}

/// The `gpool submit` fields that `argv` gives (not their defaults).
fn fields_given(argv: &[String]) -> Vec<String> {
    use clap::CommandFactory;
    let Ok(matches) = crate::Cli::command().try_get_matches_from(argv) else {
        return Vec::new();
    };
    let Some((_, submit)) = matches.subcommand() else {
        return Vec::new();
    };
    submit
        .ids()
        .filter(|id| submit.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.as_str().to_string())
        .collect()
}

/// How a script runs: by its `#!` interpreter (or /bin/sh) on a copy of it
/// as it is now (later edits change nothing), so it needs no execute bit;
/// the command names its absolute path, where the node puts the copy.
fn script_command(script: &[String]) -> Result<(Vec<String>, gpool_core::model::BatchScript), CliError> {
    let [path, args @ ..] = script else {
        return Err(CliError::Usage("SCRIPT: missing".into()));
    };
    let absolute = std::path::absolute(path).map_err(|err| CliError::Usage(format!("{path}: {err}")))?;
    let text = read_bounded(&absolute)?;
    let mut command: Vec<String> = match text.lines().next().and_then(|line| line.strip_prefix("#!")) {
        Some(interpreter) => interpreter.split_whitespace().map(String::from).collect(),
        None => vec!["/bin/sh".to_string()],
    };
    if command.is_empty() {
        command.push("/bin/sh".to_string());
    }
    let at = command.len() as u32;
    command.push(absolute.display().to_string());
    command.extend(args.iter().cloned());
    Ok((command, gpool_core::model::BatchScript { text, at }))
}

pub async fn run(ctx: &Ctx, args: SubmitArgs) -> Result<u8, CliError> {
    let (wait, attach, fail_fast) = (args.wait || args.attach, args.attach, args.fail_fast);
    if attach && args.array.is_some() {
        return Err(CliError::Usage(
            "--attach follows one job, and an array has many tasks: use --wait".into(),
        ));
    }
    let (hold, tasks_per_node) = (args.hold, args.ntasks_per_node.unwrap_or(0));
    if hold && (attach || args.pty) {
        return Err(CliError::Usage(
            "--hold: a held job does not start until `gpool release`, so it cannot be followed (--attach, --pty, gpool run, gpool alloc); use --wait".into(),
        ));
    }
    let pty = args.pty.then(super::terminal::size);
    let mut specs = specs_from_args(args)?;
    for spec in specs.iter_mut() {
        spec.hold |= hold;
        spec.tasks_per_node = tasks_per_node;
    }
    for spec in specs.iter_mut().filter(|_| pty.is_some()) {
        spec.pty = pty;
        // A shell that starts again elsewhere is not the session it was.
        spec.requeue = false;
    }
    let mut conn = ctx.connect().await?;
    let request = gpool_proto::convert::submit_request(&specs);
    drop(specs);
    let ids = conn
        .client
        .submit_jobs(request)
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner()
        .ids;
    if pty.is_some() {
        eprintln!("gpool: job {} submitted; waiting for it to start", ids[0]);
        return super::terminal::session(&mut conn, ids[0]).await;
    }
    if attach {
        eprintln!("gpool: job {} submitted; its output follows", ids[0]);
    } else if ctx.json() && wait {
        // One JSON document: the summary once all have ended.
        eprintln!("gpool: submitted {}", super::jobs::id_list(&ids));
    } else if ctx.json() {
        output::print_json(&serde_json::json!({ "ids": ids }));
    } else {
        for id in &ids {
            outln!("{}", crate::slurm::sbatch::submitted_line(*id));
        }
    }
    if !wait {
        return Ok(0);
    }
    if attach {
        // Output that cannot be followed (discarded, in a file, never
        // started) is said; the wait goes on.
        if let Err(err) = super::logs::stream(&mut conn, ids[0], (true, false), (0, 0), None).await {
            eprintln!("gpool: not attached to job {}: {err}", ids[0]);
        }
    }
    let how = super::jobs::Waiting {
        fail_fast,
        own_code: attach,
        json: ctx.json(),
        quiet: false,
    };
    super::jobs::wait_for(&mut conn, &ids, how).await
}

fn parse_export(text: &str) -> Result<gpool_core::spec::Export, String> {
    gpool_core::spec::Export::parse(text).map_err(|err| err.reason)
}

fn specs_from_args(args: SubmitArgs) -> Result<Vec<JobSpec>, CliError> {
    // A job file's jobs get the shell's variables only when asked: a batch
    // of thousands would carry (and store) a copy in every job.
    let export = match (&args.export, &args.file) {
        (Some(export), _) => export.clone(),
        (None, Some(_)) => gpool_core::spec::Export {
            all: false,
            named: Vec::new(),
        },
        (None, None) => gpool_core::spec::Export::default(),
    };
    let cwd = std::env::current_dir()
        .map_err(|err| CliError::Usage(format!("workdir: cannot read the current directory: {err}")))?
        .display()
        .to_string();
    let mut specs = match &args.file {
        Some(path) => {
            let text = read_bounded(path)?;
            parse_job_file(&path.display().to_string(), &text).map_err(|err| CliError::Usage(err.to_string()))?
        }
        None => vec![input_from_flags(args)?
            .into_spec()
            .map_err(|err| CliError::Usage(err.to_string()))?],
    };
    for spec in &mut specs {
        if spec.workdir.is_empty() {
            spec.workdir = cwd.clone();
        }
        // The shell's variables first; the spec's own win. A container's
        // environment is its image's: it gets only the variables named.
        let export = if spec.image.is_empty() {
            export.clone()
        } else {
            gpool_core::spec::Export {
                all: false,
                ..export.clone()
            }
        };
        let mut env = export.apply(std::env::vars());
        env.extend(spec.env.iter().cloned());
        spec.env = env.into_iter().collect();
        spec.validate().map_err(|err| {
            CliError::Usage(format!(
                "{err} (the exported environment counts: narrow it with --export)"
            ))
        })?;
    }
    Ok(specs)
}

/// A batch script (no `--` before it): its text as it is now, run in
/// place of its path; the job is named after it unless -J names it.
fn snapshot_script(args: &mut SubmitArgs) -> Result<Option<gpool_core::model::BatchScript>, CliError> {
    if !args.script {
        return Ok(None);
    }
    let Some(script) = args.command.first() else {
        return Err(CliError::Usage(
            "the script's #GPOOL lines end with a flag that lacks its value".into(),
        ));
    };
    if args.name.is_none() {
        args.name = std::path::Path::new(script)
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
    }
    let (command, script) = script_command(&args.command)?;
    args.command = command;
    Ok(Some(script))
}

fn input_from_flags(mut args: SubmitArgs) -> Result<JobSpecInput, CliError> {
    // A word before `--` that looks like a flag is one gpool does not know:
    // it must never become the command the job runs.
    if let Some(flag) = args
        .command
        .first()
        .filter(|word| word.len() > 1 && word.starts_with('-'))
    {
        return Err(CliError::Usage(unknown_flag(flag)));
    }
    if let Some(line) = args.wrap.take() {
        args.command = vec!["/bin/sh".to_string(), "-c".to_string(), line];
        args.name.get_or_insert_with(|| "wrap".to_string());
    }
    let snapshot = snapshot_script(&mut args)?;
    if args.command.is_empty() {
        return Err(CliError::Usage(
            "command: give the command after `--` (gpool submit --gpus 1 -- python train.py), a shell command line with --wrap, or a job file with -f"
                .into(),
        ));
    }
    let env = args
        .env
        .iter()
        .map(|text| parse_env_assignment(text))
        .collect::<Result<_, _>>()
        .map_err(|err| CliError::Usage(err.to_string()))?;
    let (gpus, gpu_type) = gpus::gpus_and_model(&mut args)?;
    // One task per node: its CPUs are shared among the node's GPUs.
    let cpus_per_gpu = match args.cpus_per_task {
        Some(cpus) if cpus > 0 => Some((cpus + gpus.unwrap_or(1).max(1) - 1) / gpus.unwrap_or(1).max(1)),
        Some(cpus) => Some(cpus),
        None => args.cpus_per_gpu,
    };
    Ok(JobSpecInput {
        name: args.name,
        command: Some(CommandInput::Argv(args.command)),
        gpus,
        nodes: args.nodes,
        gpu_type: gpu_type.map(OneOrMany::One),
        team: args.team,
        project: args.project,
        workload_type: args.workload_type,
        time: args.time,
        env: Some(env),
        workdir: args.workdir,
        priority: args.priority,
        pool: args.pool,
        requeue: Some(!args.no_requeue),
        discard_output: Some(args.discard_output),
        qos: args.qos,
        checkpoint_signal: args.checkpoint_signal,
        grace: args.grace,
        image: args.image,
        mem: args.mem,
        mem_per_gpu: args.mem_per_gpu,
        max_output: args.max_output,
        script: snapshot,
        begin: args.begin,
        reservation: args.reservation,
        notify: args.notify,
        notify_on: args.notify_on,
        cpus_per_gpu,
        exclusive: Some(args.exclusive),
        dependency: args.dependency,
        array: args.array,
        stdout: args.stdout,
        stderr: args.stderr,
        min_gpu_memory: args.min_gpu_memory,
        nvlink: args.nvlink,
        constraint: args.constraint.map(OneOrMany::One),
        nodelist: args.nodelist.map(OneOrMany::One),
        exclude: args.exclude.map(OneOrMany::One),
        gpu_mem: args.share.gpu_mem,
        gpu_fraction: args.share.gpu_fraction,
        gpu_share: args.share.gpu_share,
    })
}
