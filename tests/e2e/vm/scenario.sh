#!/bin/busybox sh
# The cgroup v2 node's scenario, run as init in a VM booted with Debian's
# own kernel (tests/e2e/cgroup_v2.rs builds the initramfs and reads what
# this prints): the real gpoold, gpool-agent and gpool on loopback, an
# agent in a cgroup of its own with the controllers delegated to it (the
# README's recipe for a host without systemd), and one job per behaviour.
# Each finding is a line `GPOOL-VM <key> <value...>`.
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /sys/fs/cgroup /tmp /root
mount -t cgroup2 none /sys/fs/cgroup
mount -t tmpfs tmp /tmp
ip link set lo up
say() { echo "GPOOL-VM $*"; }
finish() {
  say agent-log-tail "$(tail -n 30 /tmp/agent.log | tr '\n' '|')"
  say gpoold-log-tail "$(tail -n 10 /tmp/gpoold.log | tr '\n' '|')"
  say done
  poweroff -f
}
say kernel "$(uname -r)"
say controllers "$(cat /sys/fs/cgroup/cgroup.controllers)"
# Stand-ins for the GPUs' device nodes (no driver: opening one says ENXIO
# unless a device filter refuses it first, with EPERM).
for n in 0 1 2 3 4 5 6 7; do mknod /dev/nvidia$n c 195 $n; done
mknod /dev/nvidiactl c 195 255

# A cgroup of the agent's own, with the controllers it hands to jobs.
echo "+cpuset +cpu +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/gpool-agent/agent
start_agent() {
  (echo 0 > /sys/fs/cgroup/gpool-agent/agent/cgroup.procs && exec gpool-agent --config /etc/gpool/agent.toml >> /tmp/agent.log 2>&1) &
}

XDG_RUNTIME_DIR=/tmp/run gpoold --dev --dev-nodes 0 --listen 127.0.0.1:0 --state-dir /tmp/state > /tmp/gpoold.log 2>&1 &
i=0
while [ ! -s /tmp/state/gpoold.addr ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
export GPOOL_SERVER="$(cat /tmp/state/gpoold.addr)"
[ -n "$GPOOL_SERVER" ] || { say error "gpoold wrote no address"; finish; }
mkdir -p /etc/gpool
cat > /etc/gpool/agent.toml <<TOML
controller = "$GPOOL_SERVER"
node_name = "v2node"
spool_dir = "/tmp/spool"
heartbeat_interval = "200ms"
min_spool_free = "1M"
max_pids = 64
[[simulated_gpu]]
model = "h100"
memory_mib = 81559
count = 8
TOML
start_agent
up=""
i=0
while [ -z "$up" ] && [ $i -lt 300 ]; do
  up=$(gpool nodes 2>/dev/null | grep v2node | grep -v down)
  sleep 0.2; i=$((i+1))
done
[ -n "$up" ] || { say error "the agent did not register"; finish; }
say enforces "$(gpool nodes --output json | grep -o '"gpool.enforces": *"[^"]*"' | sed 's/.*: *"\(.*\)"/\1/')"
say agent-oom-score-adj "$(cat /proc/$(pidof gpool-agent)/oom_score_adj)"
say agent-cgroup "$(cut -d: -f3 /proc/$(pidof gpool-agent)/cgroup)"

# Prints `<key> <job state>` and the job's output, one line each.
state_of() { gpool show "$1" --output json | grep -o '"state": *"[^"]*"' | head -n 1 | sed 's/.*: *"\(.*\)"/\1/'; }
report() {
  timeout 180 gpool wait "$2" > /dev/null 2>&1
  say "$1-state" "$(state_of "$2")"
  gpool logs "$2" 2>/dev/null | while read -r line; do say "$1-out" "$line"; done
}
CG='CG=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)'

# 2. Four busy threads under one CPU (alone on the node, so that nothing
# else takes the CPUs it would use).
cpu=$(gpool submit --gpus 1 --cpus-per-gpu 1 -- sh -c "$CG"'; for i in 1 2 3 4; do timeout 6 sh -c "while :; do :; done" & done; wait; echo "cpu.max $(cat $CG/cpu.max)"; while read k v; do echo "cpu.stat $k $v"; done < $CG/cpu.stat')
report cpu "$cpu"

# 1, 3 and 4 side by side: a neighbour, a job past its memory, a fork
# bomb, and a job that tries every GPU's device node.
neighbour=$(gpool submit --gpus 1 --mem 64M -- sh -c 'sleep 12; echo neighbour-ok')
oom=$(gpool submit --gpus 1 --mem 256M -- sh -c 'exec dd if=/dev/zero of=/dev/null bs=400M count=1')
# The bomb forks until refused; then the job's shell reads its cgroup with
# builtins alone (no fork is left to it).
bomb=$(gpool submit --gpus 1 -- sh -c "$CG"'; sh -c "while :; do sleep 60 & done" 2> /dev/null; read cur < $CG/pids.current; read max < $CG/pids.max; echo "pids $cur of $max"; while read k v; do echo "events $k $v"; done < $CG/pids.events')
devices=$(gpool submit --gpus 1 -- sh -c 'echo "visible $CUDA_VISIBLE_DEVICES"; echo "oom_score_adj $(cat /proc/self/oom_score_adj)"; for n in 0 1 2 3 4 5 6 7; do if cat /dev/nvidia$n > /dev/null 2> /tmp/e.$n; then echo "dev$n opened"; else echo "dev$n $(cat /tmp/e.$n)"; fi; done')
report oom "$oom"
say oom-events "$(gpool show "$oom" | grep -i -m 1 'memory')"
report devices "$devices"
# The OOM order of the node's own processes: the agent's keeper (its
# child) and the launcher (the keeper's child).
agent_pid=$(pidof gpool-agent)
for p in $(pidof gpool-supervise); do
  parent=$(awk '{print $4}' /proc/$p/stat)
  if [ "$parent" = "$agent_pid" ]; then role=keeper; else role=launcher; fi
  say supervise-oom "$role $(cat /proc/$p/oom_score_adj)"
done
report neighbour "$neighbour"
report bomb "$bomb"
after=$(gpool submit --gpus 1 -- echo node-still-up)
report after-bomb "$after"

# 5. kill -9 of the agent under a running job; the restarted agent takes
# it up again, limits and all.
kept=$(gpool submit --gpus 1 --mem 96M -- sh -c "$CG"'; sleep 10; echo "memory.max $(cat $CG/memory.max) swap $(cat $CG/memory.swap.max)"; echo "cgroup $(cut -d: -f3 /proc/self/cgroup)"')
i=0
while [ "$(state_of "$kept")" != running ] && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done
sleep 2
kill -9 "$(pidof gpool-agent)"
say agent-killed "$(state_of "$kept")"
start_agent
report kept "$kept"
say kept-attempts "$(gpool show "$kept" --output json | grep -o '"attempt": *[0-9]*' | head -n 1)"
say clone3-fallbacks "$(grep -c 'clone3 into' /tmp/agent.log)"
finish
