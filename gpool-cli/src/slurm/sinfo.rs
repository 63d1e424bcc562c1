//! `sinfo`: pools as Slurm's partitions, nodes grouped by state.

use super::format;
use crate::CliError;
use gpool_proto::pb;

const DEFAULT_FORMAT: &str = "%9P %.5a %.10l %.6D %.6t %N";

#[derive(clap::Parser, Debug)]
#[command(name = "sinfo", disable_help_flag = true)]
pub struct Args {
    /// Print help (`-h` is --noheader, as in Slurm).
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    #[arg(short = 'p', long = "partition")]
    partition: Option<String>,
}

pub async fn run(ctx: &crate::cmd::Ctx, args: Args) -> Result<u8, CliError> {
    let nodes = super::nodes(ctx).await?;
    // (partition, state) -> its nodes, in first-seen order.
    let mut groups: Vec<((String, &'static str), Vec<&pb::Node>)> = Vec::new();
    for node in &nodes {
        for pool in &node.pools {
            if args.partition.as_ref().is_some_and(|wanted| wanted != pool) {
                continue;
            }
            let key = (pool.clone(), state(node));
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(node),
                None => groups.push((key, vec![node])),
            }
        }
    }
    let pieces = format::parse_format(args.format.as_deref().unwrap_or(DEFAULT_FORMAT));
    let mut out = Vec::new();
    if !args.noheader {
        out.push(format::line(&pieces, |letter| header(letter).to_string()));
    }
    for ((pool, state), members) in &groups {
        out.push(format::line(&pieces, |letter| field(letter, pool, state, members)));
    }
    if !out.is_empty() {
        outln!("{}", out.join("\n"));
    }
    Ok(0)
}

fn header(letter: char) -> &'static str {
    match letter {
        'P' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' => "STATE",
        'N' => "NODELIST",
        'G' => "GRES",
        _ => "?",
    }
}

fn field(letter: char, pool: &str, state: &str, nodes: &[&pb::Node]) -> String {
    match letter {
        'P' if pool == "default" => "default*".into(),
        'P' => pool.to_string(),
        'a' => "up".into(),
        'l' => "infinite".into(),
        'D' => nodes.len().to_string(),
        't' => state.to_string(),
        'N' => gpool_core::slurm::hostlist(&nodes.iter().map(|node| node.name.clone()).collect::<Vec<_>>()),
        'G' => {
            let mut gres: Vec<String> = nodes
                .iter()
                .map(|node| format!("gpu:{}:{}", crate::output::gpu_models(node), node.gpus.len()))
                .collect();
            gres.dedup();
            gres.join(",")
        }
        other => format!("%{other}"),
    }
}

/// A node's state in sinfo's compact words.
fn state(node: &pb::Node) -> &'static str {
    match crate::output::node_state(node) {
        "idle" => "idle",
        "allocated" => "alloc",
        "mixed" => "mix",
        "draining" => "drng",
        "drained" => "drain",
        "down" => "down",
        "powered_down" | "powering_down" => "idle~",
        "powering_up" => "idle#",
        _ => "unk",
    }
}
