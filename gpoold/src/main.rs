//! `gpoold`: parses flags and runs the controller until SIGINT or SIGTERM.

use clap::Parser;
use gpool_core::sched::Policy;
use gpoold::config::Config;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "gpoold", version, about = "The gpool controller")]
struct Args {
    /// gpoold.toml (see config/gpoold.toml).
    #[arg(long, conflicts_with = "dev", required_unless_present = "dev")]
    config: Option<PathBuf>,
    /// Dev mode: loopback only, no TLS, a temporary state dir unless given.
    #[arg(long)]
    dev: bool,
    /// State dir in dev mode.
    #[arg(long, requires = "dev")]
    state_dir: Option<PathBuf>,
    /// Address to listen on in dev mode (port 0 picks a free port).
    #[arg(long, requires = "dev", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Dev mode: in-process agents (0 for none). With NVIDIA GPUs present,
    /// one agent offers the real GPUs instead.
    #[arg(long, requires = "dev", default_value_t = 2)]
    dev_nodes: u32,
    /// Dev mode: simulated GPUs per in-process agent.
    #[arg(long, requires = "dev", default_value_t = 8)]
    dev_gpus_per_node: u32,
    /// Dev mode: model of the simulated GPUs.
    #[arg(long, requires = "dev", default_value = "h100")]
    dev_gpu_model: String,
    /// Dev mode: how long an agent may be silent before its node is down.
    #[arg(long, requires = "dev", default_value = "30s", value_parser = gpoold::config::parse_node_timeout)]
    node_timeout: std::time::Duration,
    /// Dev mode: serve Prometheus metrics at http://ADDR/metrics (in a
    /// config, `metrics_listen`).
    #[arg(long, requires = "dev", value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Dev mode: how long an interactive job may have no client attached
    /// before it is hung up on (in a config, `detach_grace`).
    #[arg(long, requires = "dev", default_value = "1m", value_parser = humantime::parse_duration)]
    detach_grace: std::time::Duration,
}

fn main() -> ExitCode {
    // Hooks (sendmail, the dev nodes' jobs) get nothing this process was
    // started with.
    gpool_proto::inherited::close_inherited_on_exec();
    gpool_agent::memory::use_one_malloc_arena();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GPOOL_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in journald or files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let shutdown = gpool_agent::terminate_signal();
    // SIGHUP reloads a config file; without one it ends gpoold as it would
    // any process whose terminal closes.
    let hangups = match args.config {
        Some(_) => gpoold::hangup_signal(),
        None => tokio::sync::mpsc::unbounded_channel().1,
    };
    match run(args, shutdown, hangups) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("gpoold: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    args: Args,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    hangups: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<()> {
    let mut temp_state_dir = None;
    let config = match (args.config, args.dev) {
        (Some(path), _) => Config::load(&path)?,
        (None, _) => {
            if !args.listen.ip().is_loopback() {
                anyhow::bail!("--listen: dev mode listens on loopback only, not {}", args.listen);
            }
            let state_dir = match args.state_dir {
                Some(dir) => dir,
                None => {
                    let dir = tempfile::Builder::new().prefix("gpool-dev-").tempdir()?;
                    let path = dir.path().to_path_buf();
                    temp_state_dir = Some(dir);
                    path
                }
            };
            eprintln!(
                "gpoold: DEV MODE: no TLS, callers' user names are trusted, loopback only; state in {}{}",
                state_dir.display(),
                if temp_state_dir.is_some() {
                    " (temporary, removed at exit)"
                } else {
                    ""
                }
            );
            Config {
                ha: None,
                power: Vec::new(),
                listen: args.listen,
                state_dir,
                dev: true,
                // Dev mode runs as whoever starts it, where nothing may
                // be enforced: jobs that ask for limits run, with a warning.
                policy: Policy {
                    enforce_limits: gpool_core::enforce::EnforceLimits::Warn,
                    ..Policy::default()
                },
                admins: vec!["*".into()],
                node_timeout: args.node_timeout,
                forget_nodes_after: Some(gpoold::config::DEFAULT_FORGET_NODES_AFTER),
                keep_ended_jobs: Some(gpoold::config::DEFAULT_KEEP_ENDED_JOBS),
                history_file_records: gpoold::state::store::RECORDS_PER_FILE,
                accounting: Default::default(),
                metrics_listen: args.metrics_listen,
                straggler_after: gpoold::config::DEFAULT_STRAGGLER_AFTER,
                detach_grace: args.detach_grace,
                max_message_size: gpool_proto::DEFAULT_MAX_MESSAGE_BYTES,
                dev_agents: (args.dev_nodes > 0).then_some(gpoold::config::DevAgents {
                    n_nodes: args.dev_nodes,
                    gpus_per_node: args.dev_gpus_per_node,
                    gpu_model: args.dev_gpu_model,
                    gpu_memory_mib: 81_559,
                }),
                path: None,
                socket: None,
                tls: None,
                plaintext_from: gpoold::config::loopback_ranges(),
                insecure_plaintext: false,
                health: Default::default(),
                // Dev mode is one user on loopback: any webhook.
                notify: gpool_core::model::NotifyRules {
                    webhooks: vec!["http://".into(), "https://".into()],
                    sendmail: None,
                },
            }
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(gpoold::run(config, shutdown, hangups));
    drop(temp_state_dir);
    outcome
}
