//! `gpool`: submit, inspect and cancel jobs; drain and resume nodes.
//!
//! Exit codes: 0 success; 1 the request failed; 2 bad usage or input;
//! 69 the controller could not be reached; 141 stdout was closed early.
//! `submit --wait` and `gpool wait` exit with 3 when a job failed, 124 when
//! one ran out of time, 125 when one was cancelled (the first such job in
//! submit order decides), and 130 when the user stopped waiting;
//! `submit --attach`, `run` and `alloc` exit with the job's own code, as srun and salloc do.

/// `println!`, except that a closed stdout (`gpool show 1 | head -1`) ends
/// gpool quietly with exit code 141, as SIGPIPE ends other Unix tools,
/// instead of a panic. (SIGPIPE itself stays ignored: gpool's sockets must
/// not raise it.)
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Set where gpool speaks as a command that says nothing on success
/// (`scancel`): stdout stays empty, errors still go to stderr.
pub static QUIET_STDOUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes to stdout; see `outln!`.
pub fn write_stdout(text: std::fmt::Arguments) {
    use std::io::Write;
    if QUIET_STDOUT.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Err(err) = std::io::stdout().lock().write_fmt(text) {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(EXIT_CLOSED_STDOUT.into());
        }
        eprintln!("gpool: cannot write to stdout: {err}");
        std::process::exit(1);
    }
}

/// Exit code when stdout was closed early (128 + SIGPIPE).
pub const EXIT_CLOSED_STDOUT: u8 = 141;

#[cfg(test)]
mod cli_tests;
mod client;
mod cmd;
mod error;
mod man;
mod output;
mod parse;
mod slurm;

pub use error::CliError;

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "gpool", version, about = "Submit and manage jobs on a gpool GPU cluster")]
pub struct Cli {
    /// Controller address (HOST:PORT, https://HOST:PORT or unix:PATH), or
    /// several separated by commas, tried in turn; defaults to a running dev
    /// controller, then the local socket.
    #[arg(long, global = true, env = "GPOOL_SERVER")]
    server: Option<String>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// How long to wait for gpoold to connect and to answer each request
    /// (a duration such as 30s; 0 waits as long as it takes). Waiting for
    /// jobs (--wait) and following logs are not bounded by it.
    #[arg(long, global = true, env = "GPOOL_TIMEOUT", default_value = "30s", value_parser = cmd::parse_timeout)]
    timeout: std::time::Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Submit a job (or every [[job]] of a file with -f) and print its id.
    Submit(Box<cmd::submit::SubmitArgs>),
    /// Hold GPUs and open a shell on the node on a terminal relayed to this
    /// one, as salloc: the job's GPUs are in its CUDA_VISIBLE_DEVICES, and
    /// the allocation ends with the shell (`exit`), whose code it returns.
    /// `-- CMD ARGS...` runs that instead of your shell. The submit flags
    /// apply (-G, --team, --qos, --time, ...).
    Alloc(Box<cmd::submit::SubmitArgs>),
    /// Slurm's commands for the scripts and tools that drive Slurm:
    /// `gpool slurm install DIR` links squeue, sacct, scancel and sinfo
    /// to this binary, which then takes their options and prints their
    /// formats.
    #[command(subcommand)]
    Slurm(slurm::SlurmCommand),
    /// Relay this terminal to a running interactive job's again (after a
    /// dropped connection, within gpoold's detach_grace), as its alloc
    /// did; exits with the job's own code.
    Attach {
        /// Job id.
        #[arg(value_parser = cmd::parse_job_ref)]
        id: cmd::JobRef,
    },
    /// Run a command and follow its output, exiting with its code, as
    /// srun; with --pty, on a terminal relayed to this one. The submit
    /// flags apply.
    Run(Box<cmd::submit::SubmitArgs>),
    /// List jobs (pending and running unless --all or --state).
    Jobs(cmd::jobs::JobsArgs),
    /// Show everything about one job, including why it is pending; or
    /// about one node, with the limits it enforces.
    Show {
        /// Job id (123, or 123_4 for task 4 of array 123), or a node's name.
        #[arg(value_parser = cmd::parse_show_target)]
        target: cmd::ShowTarget,
        /// Print every variable of the job's environment (the table
        /// otherwise counts them; JSON always has them).
        #[arg(long)]
        env: bool,
    },
    /// Print a job's output (rank 0's for a gang; its latest attempt).
    Logs {
        /// Job id (123, or 123_4 for task 4 of array 123).
        #[arg(value_parser = cmd::parse_job_ref)]
        id: cmd::JobRef,
        /// Keep printing what the job writes until it ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Its stderr instead of its stdout.
        #[arg(long)]
        stderr: bool,
        /// A gang's rank whose output to print (0, the first node, by default).
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// An earlier attempt's output (1 for the first; default: the
        /// latest), of a requeued or preempted job.
        #[arg(long, default_value_t = 0)]
        attempt: u32,
    },
    /// Cancel jobs (each id that can be; the others are named), or the
    /// jobs matching --user/--name/--state/--team, as scancel.
    Cancel {
        /// Job ids (123; 123_4 for one task of an array, 123 for all of it;
        /// 100-110 for a range).
        #[arg(value_parser = cmd::parse_job_ref, required_unless_present_any = ["user", "name", "state", "team", "me"])]
        ids: Vec<cmd::JobRef>,
        /// Only send this signal (USR1, SIGUSR1 or 10) to the running jobs'
        /// processes; do not cancel them.
        #[arg(long, short = 's', value_name = "SIGNAL", value_parser = cmd::cancel::parse_signal)]
        signal: Option<i32>,
        #[command(flatten)]
        filter: cmd::cancel::Filter,
    },
    /// Stop running jobs and put them back in the queue (their checkpoint
    /// signal and grace first, as a preemption), as `scontrol requeue`.
    Requeue {
        /// Job ids.
        #[arg(required = true, value_parser = cmd::parse_job_ref)]
        ids: Vec<cmd::JobRef>,
    },
    /// Change pending jobs: a shorter time limit (longer: admins), a
    /// priority, an array's %N.
    Update(cmd::cancel::UpdateArgs),
    /// Ended jobs over a time window, as sacct: state, exit code, GPU-hours,
    /// nodes (yours unless --user or --all-users).
    History(cmd::history::HistoryArgs),
    /// Replay a trace of jobs through gpool's scheduler on a virtual clock,
    /// under several policies on the same cluster (each team on dedicated
    /// GPUs, one FIFO pool, gpool's sharing), and compare waits,
    /// allocation and each team's share.
    Sim(Box<cmd::sim::SimArgs>),
    /// Keep pending jobs from being scheduled until released.
    Hold {
        /// Job ids.
        #[arg(required = true, value_parser = cmd::parse_job_ref)]
        ids: Vec<cmd::JobRef>,
    },
    /// Let held jobs be scheduled again.
    Release {
        /// Job ids.
        #[arg(required = true, value_parser = cmd::parse_job_ref)]
        ids: Vec<cmd::JobRef>,
    },
    /// Wait for jobs to end; exit as `submit --wait` does (3, 124 or 125
    /// for the first job, in the order given, that did not complete).
    Wait {
        /// Job ids (an array's id waits for all its tasks).
        #[arg(required = true, value_parser = cmd::parse_job_ref)]
        ids: Vec<cmd::JobRef>,
        /// The first job that does not complete cancels the rest.
        #[arg(long)]
        fail_fast: bool,
    },
    /// List nodes and their GPUs.
    Nodes {
        /// One line per pool (as sinfo): nodes by state, and GPUs
        /// allocated/idle/out of service/total (A/I/O/T).
        #[arg(long, short = 's')]
        summary: bool,
    },
    /// Stop placing new jobs on a node (or on one of its GPUs).
    Drain {
        /// The node's name, as `gpool nodes` lists it.
        node: String,
        /// Only this GPU (its index): it stays out of service until `gpool
        /// resume NODE --gpu IDX`, whatever its health.
        #[arg(long)]
        gpu: Option<u32>,
        /// Why (shown in `gpool nodes` and `gpool health`).
        #[arg(long, required = true)]
        reason: String,
        /// Requeue the running jobs now instead of letting them finish.
        #[arg(long)]
        now: bool,
    },
    /// Let a drained node (or GPU) take jobs again.
    Resume {
        /// The node's name, as `gpool nodes` lists it.
        node: String,
        /// Only this GPU (its index).
        #[arg(long)]
        gpu: Option<u32>,
    },
    /// GPUs and nodes out of service and why, and the health history
    /// (faults, drains, returns, jobs' own Xids).
    Health {
        /// Only this node.
        node: Option<String>,
    },
    /// Sysadmin commands.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Nodes kept for a window: create (admins), delete, list.
    #[command(subcommand)]
    Reservation(cmd::reservation::ReservationCommand),
    /// Why a job waits (or runs as burst work), what would make it start
    /// sooner, and its priority.
    Why {
        /// Job id.
        #[arg(value_parser = cmd::parse_job_ref)]
        id: cmd::JobRef,
    },
    /// Each team's GPU-hours this period, budget left, GPUs in use and
    /// fair-share factor.
    Usage {
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
    },
    /// GPU-hours and their cost over a window, grouped (`--by
    /// team,gpu-model`), from every attempt's accounting record; `gpool
    /// report savings`: the pool against a dedicated allocation per team.
    Report(cmd::report::ReportArgs),
    /// Who gpoold takes you to be, and how it knows.
    Whoami,
    /// The controllers of a pool run with [ha]: the leader, the standbys,
    /// the term and each lease's time left.
    Controllers,
    /// Print a completion script: `gpool completions bash >
    /// /etc/bash_completion.d/gpool` (zsh: into a directory of $fpath as
    /// _gpool; fish: ~/.config/fish/completions/gpool.fish).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write man pages for gpool and each of its commands:
    /// `gpool man --out /usr/local/share/man/man1`.
    Man {
        /// Directory to write gpool.1, gpool-submit.1... into.
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
    /// Inside a job: report a finished checkpoint (a preempted job then
    /// ends at once, and the scheduler counts less lost work).
    Checkpoint {
        /// Default: $GPOOL_JOB_ID.
        #[arg(long)]
        job: Option<u64>,
        /// Default: $GPOOL_ATTEMPT.
        #[arg(long)]
        attempt: Option<u64>,
    },
}

#[derive(clap::Subcommand)]
enum AdminCommand {
    /// Make gpoold re-read gpoold.toml (pools, teams, QoS, admins) and the
    /// certificate revocation list; a bad file is refused with its line and
    /// field, and the old policy stays.
    Reload,
    /// The cluster CA (on the controller host; no gpoold needed).
    #[command(subcommand)]
    Ca(CaCommand),
    /// Certificates for agents and for gpoold, signed by the cluster CA.
    #[command(subcommand)]
    Cert(CertCommand),
    /// User tokens (admins; gpoold keeps only their hashes).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Nodes gpoold knows.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Make a node's agent report a GPU fault as NVML would (to test
    /// health handling): `gpool admin inject n1 --gpu 0 --xid 79`.
    Inject {
        /// The node's name, as `gpool nodes` lists it.
        node: String,
        /// The GPU's index.
        #[arg(long)]
        gpu: u32,
        /// An Xid event (79: fallen off the bus, 48: double-bit ECC, 13:
        /// the job's own fault...).
        #[arg(long)]
        xid: Option<u32>,
        /// One more uncorrectable (double-bit) ECC error.
        #[arg(long)]
        ecc_dbe: bool,
        /// The temperature its readings report from now on (°C).
        #[arg(long)]
        temp: Option<u32>,
        /// The GPU is gone from its node's readings.
        #[arg(long, conflicts_with = "back")]
        vanish: bool,
        /// The GPU is back in its node's readings.
        #[arg(long)]
        back: bool,
        /// Row remapping failed (`--remap-failure false` clears it).
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        remap_failure: Option<bool>,
    },
}

#[derive(clap::Subcommand)]
enum NodeCommand {
    /// Forget a node (it comes back if its agent registers again); refused
    /// while jobs run on it.
    Remove {
        /// The node's name, as `gpool nodes` lists it.
        node: String,
    },
}

#[derive(clap::Subcommand)]
enum CaCommand {
    /// Create the cluster CA in <state-dir>/ca (ca.pem, and ca.key mode 0600).
    Init {
        /// The controller's state dir, whose ca/ holds the cluster CA.
        #[arg(long, default_value_os_t = cmd::pki::default_state_dir())]
        state_dir: std::path::PathBuf,
        /// How long the CA is valid.
        #[arg(long, default_value = "10y", value_parser = cmd::parse_validity)]
        expires: u64,
    },
}

#[derive(clap::Subcommand)]
enum CertCommand {
    /// Write NAME.pem and NAME.key (0600) into --out: an agent's client
    /// certificate (--node) or gpoold's server certificate (--controller).
    Issue {
        /// The node name the agent registers as.
        #[arg(long, conflicts_with = "controller", required_unless_present = "controller")]
        node: Option<String>,
        /// Host names and IP addresses clients dial gpoold by.
        #[arg(long, num_args = 1..)]
        controller: Vec<String>,
        /// Directory to write NAME.pem and NAME.key into.
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
        /// The controller's state dir, whose ca/ holds the cluster CA.
        #[arg(long, default_value_os_t = cmd::pki::default_state_dir())]
        state_dir: std::path::PathBuf,
        /// How long the certificate is valid.
        #[arg(long, default_value = "1y", value_parser = cmd::parse_validity)]
        expires: u64,
    },
    /// Revoke a certificate by serial, or every one issued to --node.
    Revoke {
        /// The certificate's serial (hex, as `issue` printed it).
        serial: Option<String>,
        /// Every certificate issued to this node.
        #[arg(long, conflicts_with = "serial")]
        node: Option<String>,
        /// The controller's state dir, whose ca/ holds the cluster CA.
        #[arg(long, default_value_os_t = cmd::pki::default_state_dir())]
        state_dir: std::path::PathBuf,
    },
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Issue a token; it is printed once, on stdout.
    Create {
        /// The user the token acts as.
        #[arg(long)]
        user: String,
        /// user, lead (manages --team's jobs) or admin.
        #[arg(long, default_value = "user")]
        role: String,
        /// Teams a lead token leads.
        #[arg(long = "team")]
        teams: Vec<String>,
        /// How long it is valid (e.g. 90d); never expires if absent.
        #[arg(long, value_parser = cmd::parse_validity)]
        expires: Option<u64>,
    },
    /// List tokens: id, user, role, teams, expiry and whether revoked
    /// (never the token itself).
    List,
    /// Revoke a token at once.
    Revoke {
        /// The token's id, as `list` shows it.
        id: u64,
    },
}

/// mimalloc (its v2, without transparent huge pages): `gpool sim` replays
/// full Philly in 54-63 s against 70 s on glibc's malloc, with the same
/// decisions, and a short command costs no more. gpoold keeps glibc's: on
/// its many threads mimalloc held 1.5 to 2.3 times the memory (10,000 jobs
/// pending).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Called as one of Slurm's commands (a link `gpool slurm install`
    // made): Slurm's options and formats.
    let argv: Vec<String> = std::env::args().collect();
    if let Some(command) = argv.first().and_then(|argv0| slurm::command_of(argv0)) {
        return slurm::main(command, argv);
    }
    let cli = match parse::command_line(argv) {
        Ok(cli) => cli,
        Err(err) => {
            eprintln!("gpool: {err}");
            return ExitCode::from(err.exit_code());
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("gpool: cannot start: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("gpool: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// Runs one command; `Ok` carries the exit code (non-zero only for `--wait`).
// Long by design: one arm per subcommand (admin's included), most of them
// one call into `cmd`; split up, it would only add indirection.
async fn run(cli: Cli) -> Result<u8, CliError> {
    let ctx = cmd::Ctx {
        server: cli.server,
        output: cli.output,
        timeout: (!cli.timeout.is_zero()).then_some(cli.timeout),
    };
    match cli.command {
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "gpool", &mut script);
            write_stdout(format_args!("{}", String::from_utf8_lossy(&script)));
            Ok(0)
        }
        Command::Man { out } => {
            std::fs::create_dir_all(&out).map_err(|err| CliError::Usage(format!("--out {}: {err}", out.display())))?;
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &out)
                .map_err(|err| CliError::Usage(format!("--out {}: {err}", out.display())))?;
            man::add_man_sections(&out).map_err(|err| CliError::Usage(format!("--out {}: {err}", out.display())))?;
            outln!("man pages written to {}", out.display());
            Ok(0)
        }
        Command::Submit(args) => cmd::submit::run(&ctx, *args).await,
        Command::Alloc(args) => cmd::terminal::alloc(&ctx, *args).await,
        Command::Attach { id } => cmd::terminal::attach(&ctx, id).await,
        Command::Slurm(slurm::SlurmCommand::Install { dir }) => slurm::install(&dir),
        Command::Run(args) => cmd::terminal::run(&ctx, *args).await,
        Command::Jobs(args) => cmd::jobs::run(&ctx, args).await.map(|()| 0),
        Command::Show { target, env } => cmd::show(&ctx, target, env).await.map(|()| 0),
        Command::Cancel { ids, signal, filter } => cmd::cancel::run(&ctx, ids, signal, filter).await,
        Command::Requeue { ids } => cmd::cancel::requeue(&ctx, ids).await,
        Command::Update(args) => cmd::cancel::update(&ctx, args).await,
        Command::History(args) => cmd::history::run(&ctx, args).await.map(|()| 0),
        Command::Report(args) => cmd::report::run(&ctx, args).await.map(|()| 0),
        Command::Sim(args) => cmd::sim::run(*args, ctx.json()),
        Command::Hold { ids } => cmd::cancel::hold(&ctx, ids, true).await,
        Command::Release { ids } => cmd::cancel::hold(&ctx, ids, false).await,
        Command::Wait { ids, fail_fast } => {
            let mut conn = ctx.connect().await?;
            let ids = conn.resolve(&ids).await?;
            let how = cmd::jobs::Waiting {
                fail_fast,
                own_code: false,
                json: ctx.json(),
                quiet: false,
            };
            cmd::jobs::wait_for(&mut conn, &ids, how).await
        }
        Command::Logs {
            id,
            follow,
            stderr,
            rank,
            attempt,
        } => cmd::logs::run(&ctx, id, follow, stderr, (rank, attempt))
            .await
            .map(|()| 0),
        Command::Nodes { summary } => cmd::nodes::list(&ctx, summary).await.map(|()| 0),
        Command::Drain { node, gpu, reason, now } => cmd::nodes::drain(&ctx, node, gpu, Some((reason, now)))
            .await
            .map(|()| 0),
        Command::Health { node } => cmd::nodes::health(&ctx, node).await.map(|()| 0),
        Command::Reservation(command) => cmd::reservation::run(&ctx, command).await.map(|()| 0),
        Command::Admin(AdminCommand::Inject {
            node,
            gpu,
            xid,
            ecc_dbe,
            temp,
            vanish,
            back,
            remap_failure,
        }) => {
            let fault = gpool_proto::pb::Inject {
                gpu,
                xid: xid.unwrap_or(0),
                ecc_dbe,
                temperature_c: temp,
                vanished: (vanish || back).then_some(vanish),
                remap_failure,
            };
            cmd::nodes::inject(&ctx, node, fault).await.map(|()| 0)
        }
        Command::Admin(AdminCommand::Node(NodeCommand::Remove { node })) => {
            cmd::nodes::remove(&ctx, node).await.map(|()| 0)
        }
        Command::Admin(AdminCommand::Reload) => cmd::nodes::reload(&ctx).await.map(|()| 0),
        Command::Admin(AdminCommand::Ca(CaCommand::Init { state_dir, expires })) => {
            cmd::pki::ca_init(&state_dir, expires, ctx.json()).map(|()| 0)
        }
        Command::Admin(AdminCommand::Cert(CertCommand::Issue {
            node,
            controller,
            out,
            state_dir,
            expires,
        })) => {
            let subject = match node {
                Some(node) => cmd::pki::Subject::Node(node),
                None => cmd::pki::Subject::Controller(controller),
            };
            cmd::pki::cert_issue(&state_dir, subject, &out, expires, ctx.json()).map(|()| 0)
        }
        Command::Admin(AdminCommand::Cert(CertCommand::Revoke {
            serial,
            node,
            state_dir,
        })) => cmd::pki::cert_revoke(&state_dir, serial, node, ctx.json()).map(|()| 0),
        Command::Admin(AdminCommand::Token(TokenCommand::Create {
            user,
            role,
            teams,
            expires,
        })) => cmd::access::token_create(&ctx, user, role, teams, expires)
            .await
            .map(|()| 0),
        Command::Admin(AdminCommand::Token(TokenCommand::List)) => cmd::access::token_list(&ctx).await.map(|()| 0),
        Command::Admin(AdminCommand::Token(TokenCommand::Revoke { id })) => {
            cmd::access::token_revoke(&ctx, id).await.map(|()| 0)
        }
        Command::Whoami => cmd::access::whoami(&ctx).await.map(|()| 0),
        Command::Controllers => cmd::access::controllers(&ctx).await.map(|()| 0),
        Command::Why { id } => cmd::sharing::why(&ctx, id).await.map(|()| 0),
        Command::Usage { team } => cmd::sharing::usage(&ctx, team).await.map(|()| 0),
        Command::Checkpoint { job, attempt } => cmd::checkpoint::run(&ctx, job, attempt).await.map(|()| 0),
        Command::Resume { node, gpu } => cmd::nodes::drain(&ctx, node, gpu, None).await.map(|()| 0),
    }
}
