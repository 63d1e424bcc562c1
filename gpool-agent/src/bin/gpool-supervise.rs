//! `gpool-supervise`: the spawner the agent starts once, which forks a
//! supervisor for each attempt (see `gpool_agent::supervise`). A small
//! binary of its own, so that it stays small and single-threaded.

fn main() -> std::process::ExitCode {
    gpool_agent::supervise::main()
}
