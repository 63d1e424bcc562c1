//! `gpool-supervise EXIT_FILE PROGRAM [ARGS...]`: the per-attempt supervisor
//! the agent starts each job through (see `gpool_agent::supervise`). A small
//! binary of its own, so that starting it costs little.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    gpool_agent::supervise::main(&args)
}
