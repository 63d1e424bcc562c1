//! `gpool-agent`: the node agent. GPU discovery and job launching arrive in
//! the next release; until then it says so and exits non-zero.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("gpool-agent: not yet: node agents arrive with job launching; gpoold --dev runs without them");
    ExitCode::from(69)
}
