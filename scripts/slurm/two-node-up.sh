#!/usr/bin/env bash
# Start a real two-node Slurm 22.05 cluster on this one machine, next to (and independent of) the
# single-node cluster of start-slurm.sh. Root only. Idempotent; stop it with two-node-down.sh.
#
# Layout (defaults; PREFIX=s2n, NET=10.77.0):
#   bridge s2n-br, 10.77.0.254/24, in the root namespace: clients (sbatch, sinfo) reach slurmctld
#   through it. No route, no NAT, no forwarding: the subnet reaches nothing outside this machine.
#   3 "machines", each in its own network + UTS + mount + PID namespace (netns s2n-ctl/-node1/-node2,
#   veth s2n-<name>-h on the bridge, eth0 inside), PID 1 = two-node/node-init.sh:
#     ctl    10.77.0.1   slurmctld  (port SlurmctldPort=6827)
#     node1  10.77.0.11  slurmd -N node1 (port SlurmdPort=6828), fake gres gpu:2
#     node2  10.77.0.12  slurmd -N node2 (port 6828), fake gres gpu:2
#   Each machine sees its own hostname, its own processes (so `ray stop` or `pkill` on one node does
#   not touch the other), and /etc/hosts = $DIR/hosts (ctl, node1, node2). Files are shared, as on
#   a cluster with a shared file system. munge is the machine's running munged (its socket is a
#   file, reachable from every namespace); start-slurm.sh starts it if needed.
#   $DIR (default /var/lib/slurm-2node): slurm.conf, gres.conf, hosts, state/ (slurmctld),
#   spool/<node>/, log/{slurmctld,slurmd-<node>}.log, run/<machine>.pid (PID of each machine's PID 1,
#   as seen from the root namespace), fakegpu/nvidia[0-1] (symlinks to /dev/null).
# Clients pick this cluster with SLURM_CONF=$DIR/slurm.conf (this script prints the line).
# Why namespaces and not `slurmd -N` with a port per node: this Debian build does have
# MULTIPLE_SLURMD, but such nodes share one hostname, address and process table; a Ray cluster needs
# an address per node, and `ray stop` on one node must not see (and kill) the other node's Ray.
#
# Env knobs (all optional):
#   SLURM_2NODE_DIR=/var/lib/slurm-2node   config, state, logs, pid files
#   SLURM_2NODE_PREFIX=s2n                 names of the netns / bridge / veth links
#   SLURM_2NODE_NET=10.77.0                the private /24 (first three octets)
#   SLURM_2NODE_CTLD_PORT=6827  SLURM_2NODE_SLURMD_PORT=6828
#   SLURM_2NODE_CPUS=4  SLURM_2NODE_MEM_MB=8000  SLURM_2NODE_GPUS=2   declared per node
#   SLURM_2NODE_TIMEOUT=60                 seconds to wait for the daemons and nodes
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${SLURM_2NODE_DIR:-/var/lib/slurm-2node}"
PREFIX="${SLURM_2NODE_PREFIX:-s2n}"
NET="${SLURM_2NODE_NET:-10.77.0}"
CTLD_PORT="${SLURM_2NODE_CTLD_PORT:-6827}"
SLURMD_PORT="${SLURM_2NODE_SLURMD_PORT:-6828}"
CPUS="${SLURM_2NODE_CPUS:-4}"
MEM_MB="${SLURM_2NODE_MEM_MB:-8000}"
GPUS="${SLURM_2NODE_GPUS:-2}"
TIMEOUT="${SLURM_2NODE_TIMEOUT:-60}"
BRIDGE="$PREFIX-br"
NODES=(node1 node2)
declare -A ADDR=([ctl]="$NET.1" [node1]="$NET.11" [node2]="$NET.12")
export SLURM_CONF="$DIR/slurm.conf"

T0=$EPOCHREALTIME
log() { echo "[two-node-up +$(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')s] $*"; }
die() { echo "two-node-up: $*" >&2; exit 1; }
(( EUID == 0 )) || die "needs root (network namespaces, bridge)"
for tool in ip unshare slurmctld slurmd sinfo munge; do
  command -v "$tool" >/dev/null || die "\`$tool\` not found; run scripts/slurm/start-slurm.sh (installs Slurm + munge)"
done
wait_for() { # wait_for SECONDS CMD...: poll CMD every 0.1 s until it succeeds
  local secs=$1; shift
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < end )) || return 1
    sleep 0.1
  done
}
running() { local st; st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" && [[ -n $st && $st != Z ]]; }
# machine_up NAME: the machine's PID 1 (pid file) still runs node-init.sh
machine_up() {
  local f="$DIR/run/$1.pid" pid
  [[ -s $f ]] && pid="$(cat "$f")" && running "$pid" && grep -q node-init "/proc/$pid/cmdline" 2>/dev/null
}

# ------------------------------------------------------------------ config
mkdir -p "$DIR"/{state,log,run,fakegpu} "${NODES[@]/#/$DIR/spool/}"
# One up/down at a time (two test sessions may start it at once); down, called from here, skips it.
exec 9>"$DIR/.lock"
flock -w 120 9 || die "another two-node-up/down holds $DIR/.lock"
export SLURM_2NODE_LOCKED=1
for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/fakegpu/nvidia$i"; done
gres_line="Gres=gpu:$GPUS"; gres_types="GresTypes=gpu"
(( GPUS > 0 )) || { gres_line=""; gres_types=""; }
conf="# Two-node test cluster, written by scripts/slurm/two-node-up.sh (do not edit: rewritten).
ClusterName=twonode
SlurmctldHost=ctl(${ADDR[ctl]})
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
PropagateResourceLimits=NONE
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
$gres_types
NodeName=node1 NodeAddr=${ADDR[node1]} NodeHostname=node1 CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB $gres_line State=UNKNOWN
NodeName=node2 NodeAddr=${ADDR[node2]} NodeHostname=node2 CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB $gres_line State=UNKNOWN
PartitionName=two Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
gres="# Fake GPUs: /dev/null symlinks (Slurm only stat()s them); see scripts/slurm/gres.conf.template."
(( GPUS > 0 )) && gres+=$'\n'"NodeName=node[1-2] Name=gpu File=$DIR/fakegpu/nvidia[0-$((GPUS - 1))]"
hosts="127.0.0.1 localhost
${ADDR[ctl]} ctl
${ADDR[node1]} node1
${ADDR[node2]} node2"
changed=0
write_if_changed() { # FILE CONTENT
  if [[ ! -f $1 ]] || [[ "$(cat "$1")" != "$2" ]]; then printf '%s\n' "$2" >"$1"; changed=1; fi
}
write_if_changed "$DIR/slurm.conf" "$conf"
write_if_changed "$DIR/gres.conf" "$gres"
write_if_changed "$DIR/hosts" "$hosts"

ready() { # both nodes answer and are schedulable
  local states; states="$(sinfo -h -N -p two -o '%N %T' 2>/dev/null | sort -u)" || return 1
  [[ $(grep -cE '^node[12] (idle|mixed|allocated|completing)' <<<"$states") == 2 ]]
}
if (( changed == 0 )) && machine_up ctl && machine_up node1 && machine_up node2 && ready; then
  log "already up"; echo "export SLURM_CONF=$SLURM_CONF"; exit 0
fi
# Anything half up, or a changed config: start from scratch (the cluster holds no state worth keeping).
if machine_up ctl || machine_up node1 || machine_up node2 || ip link show "$BRIDGE" >/dev/null 2>&1 \
  || ip netns list | grep -q "^$PREFIX-"; then
  log "restarting (config changed or partly up)"
  SLURM_2NODE_DIR="$DIR" SLURM_2NODE_PREFIX="$PREFIX" "$HERE/two-node-down.sh" >/dev/null
fi

# ------------------------------------------------------------------ munge (shared with the 1-node cluster)
munge -n 2>/dev/null | unmunge >/dev/null 2>&1 \
  || die "munged is not running; start it with scripts/slurm/start-slurm.sh (or runuser -u munge -- /usr/sbin/munged)"

# ------------------------------------------------------------------ network
log "network: bridge $BRIDGE ${NET}.254/24, netns $PREFIX-{ctl,node1,node2}"
ip link add "$BRIDGE" type bridge
ip addr add "$NET.254/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for m in ctl "${NODES[@]}"; do
  ns="$PREFIX-$m"
  ip netns add "$ns"
  ip link add "$PREFIX-$m-h" type veth peer name eth0 netns "$ns"
  ip link set "$PREFIX-$m-h" master "$BRIDGE" up
  ip -n "$ns" addr add "${ADDR[$m]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

# ------------------------------------------------------------------ machines
# start_machine NAME DAEMON ARGS...: PID 1 of new UTS+mount+PID namespaces inside netns PREFIX-NAME.
# (nsenter, not `ip netns exec`: that remounts /sys, hiding /sys/fs/cgroup, which slurmd needs.)
# nsenter and unshare exec (no fork) until unshare's --fork: $! is unshare, its child is PID 1.
start_machine() {
  local m=$1; shift
  setsid nsenter --net="/run/netns/$PREFIX-$m" unshare --uts --mount --pid --fork --mount-proc \
    "$HERE/two-node/node-init.sh" "$m" "$DIR/hosts" "$@" \
    </dev/null >>"$DIR/log/init-$m.log" 2>&1 9>&- &
  local outer=$! child=""
  has_child() { child="$(awk '{print $1}' "/proc/$outer/task/$outer/children" 2>/dev/null)" && [[ -n $child ]]; }
  for _ in $(seq 100); do has_child && break; sleep 0.05; done
  [[ -n $child ]] || die "machine $m did not start ($DIR/log/init-$m.log)"
  echo "$child" >"$DIR/run/$m.pid"
}
log "starting slurmctld on ctl"
start_machine ctl /usr/sbin/slurmctld -D -c -f "$SLURM_CONF"
wait_for "$TIMEOUT" bash -c 'scontrol ping | grep -q "is UP"' \
  || die "slurmctld not answering ($DIR/log/slurmctld.log)"
for n in "${NODES[@]}"; do
  log "starting slurmd on $n"
  start_machine "$n" /usr/sbin/slurmd -D -N "$n" -f "$SLURM_CONF"
done
resume_if_down() {
  sinfo -h -N -p two -o '%N %T' 2>/dev/null | while read -r n st; do
    case "$st" in down*|drain*|*drain*|fail*|inval*) scontrol update nodename="$n" state=resume ;; esac
  done
  ready
}
wait_for "$TIMEOUT" resume_if_down || {
  sinfo -N -l >&2 || true
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-node*.log >&2 || true
  die "nodes not ready after ${TIMEOUT}s"
}
log "ready"
sinfo -N -o '%N %T %c %G'
echo "export SLURM_CONF=$SLURM_CONF"
