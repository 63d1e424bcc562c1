#!/bin/bash
# Fractions of a real GPU, end to end: a dev pool on this machine's GPUs
# (gpoold --dev), two jobs of 20G and 40G sharing one GPU under its MPS
# daemon, a third that allocates past its 10G cap (it should fail alone),
# and what nvidia-smi and CUDA report inside a fraction.
#   tools/gpu-fractions-check.sh [BIN_DIR]   (default target/release)
# Copies of what it saw go to $OUT when set.
set -u
bin=$(cd "${1:-target/release}" && pwd)
out=${OUT:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
export PATH="$bin:/usr/local/nvidia/bin:$PATH"
alloc="python3 $here/cuda_alloc.py"
say() { echo; echo "== $*"; }

say "the GPU and its driver"
nvidia-smi --query-gpu=name,memory.total,memory.reserved,memory.used,driver_version --format=csv
command -v nvidia-cuda-mps-control || echo "nvidia-cuda-mps-control: not on PATH"

say "a dev pool on the real GPUs"
gpoold --dev --dev-nodes 1 >"$out/gpoold.log" 2>&1 &
pool=$!
trap 'kill $pool 2>/dev/null; wait $pool 2>/dev/null' EXIT
for _ in $(seq 100); do gpool nodes >/dev/null 2>&1 && break; sleep 0.2; done
gpool nodes
gpool nodes --output json >"$out/nodes.json"
python3 -c "import json; n=json.load(open('$out/nodes.json'))[0]; print([{k: g.get(k) for k in ('index','model','memory_mib','reserved_mib','compute_capability')} for g in n['gpus']])"

say "two fractions of 20G and 40G, each filling its cap less 2 GiB"
a=$(gpool submit --gpu-mem 20G --output json -- $alloc 18 45 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"][0])')
b=$(gpool submit --gpu-mem 40G --output json -- $alloc 38 45 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"][0])')
sleep 15
gpool jobs --all
gpool nodes
nvidia-smi

say "a fraction of 10G that allocates 12G: it should fail alone"
gpool submit --gpu-mem 10G --wait -- $alloc 12 0; echo "exit: $?"

say "what a 10G fraction sees: nvidia-smi and CUDA"
gpool submit --gpu-mem 10G --wait -- sh -c "env | grep -E 'CUDA_|GPOOL_GPU'; nvidia-smi --query-gpu=memory.total,memory.used --format=csv; $alloc 0 0"; echo "exit: $?"

say "the first two, once they end"
gpool wait "$a" "$b"; echo "exit: $?"
gpool jobs --all
for id in $(gpool jobs --all --output json | python3 -c 'import json,sys; print(" ".join(str(j["id"]) for j in json.load(sys.stdin)))'); do
    echo "-- job $id"; gpool logs "$id" 2>&1 | tail -12
done
say "the MPS daemon's log"
find / -path '*/mps/gpu*/log/*' -type f 2>/dev/null | head -5 | while read -r f; do echo "-- $f"; tail -20 "$f"; cp "$f" "$out/" 2>/dev/null; done
grep -i mps "$out/gpoold.log" | head -20
