//! `gpool-agent --config agent.toml`: the node agent.

use clap::Parser;
use gpool_agent::config::AgentConfig;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "gpool-agent", version, about = "The gpool node agent")]
struct Args {
    /// agent.toml (see config/agent.toml).
    #[arg(long)]
    config: PathBuf,
    /// Print what this node would register (GPUs, their links, labels) and
    /// one heartbeat's readings as JSON, then exit: a look at what NVML
    /// (or the simulated GPUs) report, without a controller.
    #[arg(long)]
    discover: bool,
}

fn main() -> ExitCode {
    // Jobs are born from this process's children: none gets what it was
    // started with.
    gpool_proto::inherited::close_inherited_on_exec();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GPOOL_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in journald or files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    gpool_agent::memory::use_one_malloc_arena();
    gpool_agent::memory::return_free_memory_periodically("gpool-agent-trim", || {});
    if args.discover {
        return match AgentConfig::load(&args.config) {
            Ok(config) => match gpool_agent::gpu::discovery_report(&config) {
                Ok(report) => {
                    println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(reason) => {
                    eprintln!("gpool-agent: {reason}");
                    ExitCode::FAILURE
                }
            },
            Err(err) => {
                eprintln!("gpool-agent: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let shutdown = gpool_agent::terminate_signal();
    let outcome = AgentConfig::load(&args.config)
        .map_err(anyhow::Error::from)
        .and_then(|config| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            // On a worker thread, as the tasks it talks to are: run on
            // this thread instead (block_on's own), each message between
            // the link and an attempt's task was a wake-up of another
            // thread.
            runtime.block_on(async move {
                tokio::spawn(gpool_agent::run(config, shutdown))
                    .await
                    .map_err(|err| anyhow::anyhow!("the agent's task ended: {err}"))?
            })
        });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("gpool-agent: {err:#}");
            ExitCode::FAILURE
        }
    }
}
