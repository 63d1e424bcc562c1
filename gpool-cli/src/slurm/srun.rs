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

/// Inside a job: this node's tasks (`SLURM_NTASKS_PER_NODE` of them,
/// each with its `SLURM_PROCID` and `SLURM_LOCALID`), with `-o`/`-e`
/// (patterns `%j %t %A %a %N %u %x %%`); `-n` and `--ntasks-per-node` as
/// the job has them. One task replaces this process; several are waited
/// for, and the first that failed gives the exit code.
fn run_task(options: &[String], command: &[String]) -> Result<u8, CliError> {
    let env_u32 = |name: &str, default: u32| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (per_node, first) = (env_u32("SLURM_NTASKS_PER_NODE", 1).max(1), env_u32("SLURM_PROCID", 0));
    let outputs = task_options(options, per_node)?;
    let task = |local: u32| -> Result<std::process::Command, CliError> {
        let procid = first + local;
        let mut process = std::process::Command::new(&command[0]);
        process
            .args(&command[1..])
            .env("SLURM_PROCID", procid.to_string())
            .env("SLURM_LOCALID", local.to_string());
        if let Some(pattern) = &outputs.0 {
            process.stdout(output_file(pattern, "-o", procid)?);
        }
        if let Some(pattern) = &outputs.1 {
            process.stderr(output_file(pattern, "-e", procid)?);
        }
        Ok(process)
    };
    if per_node == 1 {
        use std::os::unix::process::CommandExt;
        let err = task(0)?.exec();
        return Err(CliError::Usage(format!("srun: error: {}: {err}", command[0])));
    }
    let children: Vec<std::process::Child> = (0..per_node)
        .map(|local| {
            task(local)?
                .spawn()
                .map_err(|err| CliError::Usage(format!("srun: error: {}: {err}", command[0])))
        })
        .collect::<Result<_, _>>()?;
    let mut code = 0u8;
    for mut child in children {
        let status = child
            .wait()
            .map_err(|err| CliError::Usage(format!("srun: error: {err}")))?;
        let this = status.code().unwrap_or(1).clamp(0, 255) as u8;
        if code == 0 {
            code = this;
        }
    }
    Ok(code)
}

/// srun's options inside a job: its `-o` and `-e` patterns; the rest
/// checked against the job's own allocation, or refused by name.
fn task_options(options: &[String], per_node: u32) -> Result<(Option<String>, Option<String>), CliError> {
    let (mut stdout, mut stderr) = (None, None);
    let mut words = options.iter();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ if !word.starts_with("--") && word.len() > 2 => (&word[..2], Some(word[2..].to_string())),
            _ => (word.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| words.next().cloned()).unwrap_or_default();
        match flag {
            "-o" | "--output" => stdout = Some(value()),
            "-e" | "--error" => stderr = Some(value()),
            "-n" | "--ntasks" => check_tasks(&value(), "--ntasks", per_node, true)?,
            "--ntasks-per-node" => check_tasks(&value(), "--ntasks-per-node", per_node, false)?,
            "-u" | "--unbuffered" | "-l" | "--label" | "-Q" | "--quiet" | "-v" | "--verbose" | "-K"
            | "--kill-on-bad-exit" | "--exclusive" => {}
            // Where the job already is: its own allocation.
            "-N" | "--nodes" | "-J" | "--job-name" | "-c" | "--cpus-per-task" | "--gres" | "-G" | "--gpus"
            | "--gpus-per-node" | "--mem" | "-t" | "--time" | "--export" | "--mpi" | "--cpu-bind" => {
                let _ = value();
            }
            other => {
                return Err(CliError::Usage(format!(
                    "srun: error: {other}: gpool's srun inside a job takes -o, -e, -n, --ntasks-per-node, -u and the job's own allocation flags"
                )))
            }
        }
    }
    Ok((stdout, stderr))
}

/// `-n N` (the job's tasks) or `--ntasks-per-node N` (its tasks on a
/// node): only what the job was given.
fn check_tasks(value: &str, flag: &str, per_node: u32, total: bool) -> Result<(), CliError> {
    let nodes: u32 = std::env::var("SLURM_NNODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let allowed = if total { nodes * per_node } else { per_node };
    match value.parse::<u32>() {
        Ok(n) if n == allowed => Ok(()),
        _ => Err(CliError::Usage(format!(
            "srun: error: {flag} {value}: this job has {per_node} task(s) on each of its {nodes} node(s) ({allowed} here); submit it with the tasks it needs"
        ))),
    }
}

/// An output file of `pattern` for task `procid`, its other fields from
/// this job's variables.
fn output_file(pattern: &str, flag: &str, procid: u32) -> Result<std::fs::File, CliError> {
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
            Some('t') => path.push_str(&procid.to_string()),
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
