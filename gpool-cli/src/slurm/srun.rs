//! `srun`, `salloc` and `scontrol`. Inside a gpool job, `srun CMD` starts
//! the job's task on this node, as Slurm's starts a step's tasks: gpool
//! runs a job's script on every node of it, one task per node, each with
//! its `SLURM_PROCID`, so each node's `srun` runs CMD itself, with its
//! output where `-o`/`-e` say. Outside a job, `srun` runs a job as `gpool
//! run` does, and `salloc` opens one as `gpool alloc`.

use crate::CliError;

/// `srun [OPTIONS] CMD [ARGS]`.
pub async fn srun(argv: Vec<String>) -> Result<u8, CliError> {
    let (options, command) = super::sbatch::split(&argv[1..]);
    if command.is_empty() {
        return Err(CliError::Usage("srun: error: no command to run".into()));
    }
    if std::env::var_os("GPOOL_JOB_ID").is_some() {
        return run_task(&options, &command);
    }
    submit_as("run", &options, &command).await
}

/// `salloc [OPTIONS] [CMD [ARGS]]`.
pub async fn salloc(argv: Vec<String>) -> Result<u8, CliError> {
    let (options, command) = super::sbatch::split(&argv[1..]);
    submit_as("alloc", &options, &command).await
}

/// `gpool run`/`alloc` with the options read as `#SBATCH` lines are.
async fn submit_as(verb: &str, options: &[String], command: &[String]) -> Result<u8, CliError> {
    let mut gpool = vec!["gpool".to_string(), verb.to_string()];
    gpool.extend(super::sbatch::mapped(options, &format!("{verb} command line"))?);
    if !command.is_empty() {
        gpool.push("--".into());
        gpool.extend(command.iter().cloned());
    }
    let cli = crate::parse::command_line(gpool)?;
    crate::run(cli).await
}

/// Inside a job: this node's task, with `-o`/`-e` (patterns `%j %t %A %a
/// %N %u %x %%`) and `-n`/`--ntasks-per-node` of at most one per node.
fn run_task(options: &[String], command: &[String]) -> Result<u8, CliError> {
    use std::os::unix::process::CommandExt;
    let mut process = std::process::Command::new(&command[0]);
    process.args(&command[1..]);
    let mut words = options.iter();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ if !word.starts_with("--") && word.len() > 2 => (&word[..2], Some(word[2..].to_string())),
            _ => (word.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| words.next().cloned()).unwrap_or_default();
        match flag {
            "-o" | "--output" => {
                process.stdout(output_file(&value(), "-o")?);
            }
            "-e" | "--error" => {
                process.stderr(output_file(&value(), "-e")?);
            }
            "-n" | "--ntasks" => check_tasks(&value(), "--ntasks", true)?,
            "--ntasks-per-node" => check_tasks(&value(), "--ntasks-per-node", false)?,
            "-u" | "--unbuffered" | "-l" | "--label" | "-Q" | "--quiet" | "-v" | "--verbose" | "-K"
            | "--kill-on-bad-exit" | "--exclusive" => {}
            // Where the job already is: its own allocation.
            "-N" | "--nodes" | "-J" | "--job-name" | "-c" | "--cpus-per-task" | "--gres" | "-G" | "--gpus"
            | "--gpus-per-node" | "--mem" | "-t" | "--time" | "--export" | "--mpi" | "--cpu-bind" => {
                let _ = value();
            }
            other => {
                return Err(CliError::Usage(format!(
                    "srun: error: {other}: gpool's srun inside a job takes -o, -e, -n (one task per node), -u and the job's own allocation flags"
                )))
            }
        };
    }
    let err = process.exec();
    Err(CliError::Usage(format!("srun: error: {}: {err}", command[0])))
}

/// `-n N` (the job's node count at most, one per node) or
/// `--ntasks-per-node 1`.
fn check_tasks(value: &str, flag: &str, total: bool) -> Result<(), CliError> {
    let nodes: u64 = std::env::var("SLURM_NNODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let allowed = if total { nodes } else { 1 };
    match value.parse::<u64>() {
        Ok(n) if n == allowed => Ok(()),
        _ => Err(CliError::Usage(format!(
            "srun: error: {flag} {value}: gpool runs one task per node ({allowed} here)"
        ))),
    }
}

/// An output file of `pattern`, its fields from this task's variables.
fn output_file(pattern: &str, flag: &str) -> Result<std::fs::File, CliError> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let mut path = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            path.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => path.push_str(&var("SLURM_JOB_ID")),
            Some('t') => path.push_str(&var("SLURM_PROCID")),
            Some('A') => path.push_str(&var("SLURM_ARRAY_JOB_ID")),
            Some('a') => path.push_str(&var("SLURM_ARRAY_TASK_ID")),
            Some('N') => path.push_str(&var("GPOOL_NODE")),
            Some('u') => path.push_str(&var("USER")),
            Some('x') => path.push_str(&var("SLURM_JOB_NAME")),
            Some('%') => path.push('%'),
            other => {
                return Err(CliError::Usage(format!(
                    "srun: error: {flag} {pattern}: %{} has no meaning here",
                    other.map(String::from).unwrap_or_default()
                )))
            }
        }
    }
    std::fs::File::create(&path).map_err(|err| CliError::Usage(format!("srun: error: {flag} {path}: {err}")))
}
