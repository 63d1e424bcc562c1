#!/usr/bin/env bash
# Builds release binaries and prints gpool's benchmark figures, each with the
# load average beside it. Usage: bench/run.sh [phase...]
# Phases: submit-seq submit-par submit-phases api list schedule sharing agents
# unchanged history nodes-down
# (default: all), and history-100k (about five minutes), queue-100k and
# queue-100k-kept (GPUs kept for a QoS class; about two minutes each) and
# followers (about 40 seconds), breakdown (where the CPU goes per job
# through 4 agents, beside the machine's floor; about a minute) and
# failover (about three minutes; needs etcd, Debian's etcd-server) when
# named.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
exec target/release/gpool-bench "$@"
