//! Slurm's commands, for the scripts and workflow tools that drive Slurm:
//! the `gpool` binary called as `sbatch`, `srun`, `salloc`, `squeue`,
//! `sacct`, `scancel`, `sinfo` or `scontrol`
//! (links that `gpool slurm install DIR` makes) takes Slurm's options and
//! prints Slurm's formats; what gpool cannot do is refused by name.

pub mod format;
pub mod sacct;
pub mod sbatch;
mod scontrol;
pub mod sinfo;
pub mod squeue;
mod srun;

use crate::CliError;
use gpool_proto::pb;

#[derive(clap::Subcommand)]
pub enum SlurmCommand {
    /// Make the links (sbatch, srun, salloc, squeue, sacct, scancel,
    /// sinfo, scontrol) in DIR, e.g. /usr/local/bin.
    Install {
        /// Where the links go (made if missing).
        dir: std::path::PathBuf,
    },
}

/// A Slurm command: errors on stderr as Slurm's say them, exit code 1.
pub fn main(command: &str, argv: Vec<String>) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{command}: error: cannot start: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(command, argv)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(err) => {
            let text = err.to_string();
            if text.starts_with(command) || text.starts_with("error:") {
                eprintln!("{text}");
            } else {
                eprintln!("{command}: error: {text}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// The Slurm commands gpool answers to, by the name it is called as.
pub const COMMANDS: [&str; 8] = [
    "sbatch", "srun", "salloc", "squeue", "sacct", "scancel", "sinfo", "scontrol",
];

/// The Slurm command `argv0` names, if any.
pub fn command_of(argv0: &str) -> Option<&'static str> {
    let name = std::path::Path::new(argv0).file_name()?.to_str()?;
    COMMANDS.into_iter().find(|command| *command == name)
}

/// Runs Slurm command `name` with `argv` (its own name first); its exit
/// code is Slurm's: 0, or 1 for any error (said on stderr).
pub async fn run(name: &str, argv: Vec<String>) -> Result<u8, CliError> {
    use clap::Parser;
    let ctx = crate::cmd::Ctx {
        // As gpool's own --server: GPOOL_SERVER, else a dev controller's
        // address file, else the local socket.
        server: std::env::var("GPOOL_SERVER").ok().filter(|server| !server.is_empty()),
        output: crate::Output::Table,
        timeout: None,
    };
    match name {
        "squeue" => squeue::run(&ctx, squeue::Args::try_parse_from(argv).map_err(usage)?).await,
        "sacct" => sacct::run(&ctx, sacct::Args::try_parse_from(argv).map_err(usage)?).await,
        "sinfo" => sinfo::run(&ctx, sinfo::Args::try_parse_from(argv).map_err(usage)?).await,
        "scancel" => scancel(argv).await,
        "sbatch" => sbatch::run(argv).await,
        "srun" => srun::srun(argv).await,
        "salloc" => srun::salloc(argv).await,
        "scontrol" => scontrol::run(&ctx, argv).await,
        _ => Err(CliError::Usage(format!("{name}: not a Slurm command gpool answers to"))),
    }
}

/// A clap refusal (or --help), as Slurm's commands say it.
fn usage(err: clap::Error) -> CliError {
    match err.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
            let _ = err.print();
            std::process::exit(0)
        }
        _ => CliError::Usage(err.to_string().trim_end().to_string()),
    }
}

/// `scancel ID... [-u USER] [-s SIGNAL]`: gpool's cancel.
async fn scancel(argv: Vec<String>) -> Result<u8, CliError> {
    let mut gpool = vec!["gpool".to_string(), "cancel".to_string()];
    let mut words = argv.into_iter().skip(1);
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value.to_string())),
            _ => (word.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| words.next());
        match flag.as_str() {
            "-u" | "--user" => gpool.extend(["-u".to_string(), value().unwrap_or_default()]),
            "-s" | "--signal" => gpool.extend(["--signal".to_string(), value().unwrap_or_default()]),
            "--me" => gpool.push("--me".into()),
            "-Q" | "--quiet" | "-v" | "--verbose" => {}
            other if other.starts_with('-') => {
                return Err(CliError::Usage(format!(
                    "scancel: error: {other} is not an option gpool takes (it takes job ids, -u, --me and -s)"
                )))
            }
            id => gpool.push(id.to_string()),
        }
    }
    let cli = crate::parse::command_line(gpool)?;
    // As Slurm's, silent on success; what was left alone is said on stderr.
    crate::QUIET_STDOUT.store(true, std::sync::atomic::Ordering::Relaxed);
    crate::run(cli).await
}

/// The jobs of `user` (empty: everyone's) waiting and running, and with
/// `all` those that ended too, every chunk.
pub async fn list(conn: &mut crate::cmd::Connection, user: String, all: bool) -> Result<Vec<pb::Job>, CliError> {
    let request = pb::ListJobsRequest {
        states: Vec::new(),
        team: String::new(),
        user,
        all,
    };
    let mut chunks = conn
        .client
        .list_jobs(request)
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let mut jobs = Vec::new();
    while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
        jobs.extend(chunk.jobs);
    }
    Ok(jobs)
}

/// Every node gpoold knows.
pub async fn nodes(ctx: &crate::cmd::Ctx) -> Result<Vec<pb::Node>, CliError> {
    let mut conn = ctx.connect().await?;
    let answer = conn.client.list_nodes(pb::ListNodesRequest::default()).await;
    Ok(answer.map_err(|s| conn.refused(s))?.into_inner().nodes)
}

/// The job's partition: its pool (`default` where it named none).
pub fn partition(spec: &pb::JobSpec) -> String {
    if spec.pool.is_empty() {
        "default".into()
    } else {
        spec.pool.clone()
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// Which jobs `-j`, `-u`, `-t`/`-s`, `-p`, `-A` and `--name` keep.
pub struct Filter {
    ids: Option<Vec<String>>,
    users: Option<Vec<String>>,
    states: Option<Vec<String>>,
    partitions: Option<Vec<String>>,
    accounts: Option<Vec<String>>,
    names: Option<Vec<String>>,
}

impl Filter {
    /// Each option as given, once or more (`-j 1 -j 2`, `-j 1,2`); one
    /// not given does not filter.
    pub fn of(
        ids: &[String],
        users: &[String],
        states: &[String],
        (partitions, accounts, names): (&[String], &[String], &[String]),
    ) -> Filter {
        let list = |given: &[String]| {
            (!given.is_empty()).then(|| {
                given
                    .iter()
                    .flat_map(|text| text.split(','))
                    .map(|word| word.trim().to_string())
                    .filter(|w| !w.is_empty())
                    .collect()
            })
        };
        Filter {
            ids: list(ids),
            users: list(users),
            states: list(states),
            partitions: list(partitions),
            accounts: list(accounts),
            names: list(names),
        }
    }

    pub fn keeps(&self, job: &pb::Job) -> bool {
        let spec = job.spec.clone().unwrap_or_default();
        let among =
            |list: &Option<Vec<String>>, value: &str| list.as_ref().is_none_or(|list| list.iter().any(|v| v == value));
        let id_named = self.ids.as_ref().is_none_or(|ids| {
            ids.iter().any(|id| {
                *id == job.id.to_string()
                    || *id == format::job_id(job)
                    || (job.array_task_index.is_some() && *id == job.array_job_id.to_string())
            })
        });
        id_named
            && among(&self.users, &job.user)
            && self
                .states
                .as_ref()
                .is_none_or(|states| states.iter().any(|s| format::state_matches(s, job)))
            && among(&self.partitions, &partition(&spec))
            && among(&self.accounts, &spec.team)
            && among(&self.names, &spec.name)
    }
}

/// `gpool slurm install DIR`: links named as Slurm's commands to this
/// binary, in DIR.
pub fn install(dir: &std::path::Path) -> Result<u8, CliError> {
    let me = std::env::current_exe().map_err(|err| CliError::Usage(format!("cannot find the gpool binary: {err}")))?;
    std::fs::create_dir_all(dir).map_err(|err| CliError::Usage(format!("{}: {err}", dir.display())))?;
    for command in COMMANDS {
        let link = dir.join(command);
        if link.symlink_metadata().is_ok() {
            std::fs::remove_file(&link).map_err(|err| CliError::Usage(format!("{}: {err}", link.display())))?;
        }
        std::os::unix::fs::symlink(&me, &link).map_err(|err| CliError::Usage(format!("{}: {err}", link.display())))?;
        outln!("{} -> {}", link.display(), me.display());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    /// Each command's options are well formed (clap checks them in tests).
    #[test]
    fn each_commands_options_are_well_formed() {
        use clap::CommandFactory;
        super::squeue::Args::command().debug_assert();
        super::sacct::Args::command().debug_assert();
        super::sinfo::Args::command().debug_assert();
        assert_eq!(super::command_of("/usr/local/bin/squeue"), Some("squeue"));
        assert_eq!(super::command_of("gpool"), None);
    }
}
