#!/usr/bin/env bash
# Stop what two-node-up.sh started: each machine (slurmd node1/node2, then slurmctld) by the PID in
# its pid file -- its PID 1 gets SIGTERM, passes it to the daemon and exits with it, and the kernel
# then kills everything left in that machine's PID namespace (job steps, Ray) -- then delete the
# network namespaces, veth links and bridge. Touches nothing of the single-node cluster (not even
# munged). Safe to run when nothing is up.
#   SLURM_2NODE_DIR, SLURM_2NODE_PREFIX   as for two-node-up.sh
#   SLURM_2NODE_WIPE=1                    also delete SLURM_2NODE_DIR (config, state, logs)
set -uo pipefail
DIR="${SLURM_2NODE_DIR:-/var/lib/slurm-2node}"
PREFIX="${SLURM_2NODE_PREFIX:-s2n}"
BRIDGE="$PREFIX-br"
log() { echo "[two-node-down] $*"; }
(( EUID == 0 )) || { echo "two-node-down: needs root" >&2; exit 1; }
if [[ ${SLURM_2NODE_LOCKED:-0} != 1 && -d $DIR ]]; then  # see two-node-up.sh
  exec 9>"$DIR/.lock"
  flock -w 120 9 || { echo "two-node-down: another two-node-up/down holds $DIR/.lock" >&2; exit 1; }
fi
running() { local st; st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" && [[ -n $st && $st != Z ]]; }

stop_machine() { # stop_machine NAME
  local f="$DIR/run/$1.pid" pid
  [[ -s $f ]] || return 0
  pid="$(cat "$f")"
  if running "$pid" && grep -q node-init "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping $1 (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 200); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then log "$1 still up after 20s: SIGKILL"; kill -9 "$pid" 2>/dev/null; fi
  fi
  rm -f "$f"
}
for m in node1 node2 ctl; do stop_machine "$m"; done

for m in ctl node1 node2; do
  ip link del "$PREFIX-$m-h" 2>/dev/null && log "deleted link $PREFIX-$m-h"
  # A namespace still held by a process we did not find would stay (ip netns del only unmounts).
  ip netns del "$PREFIX-$m" 2>/dev/null && log "deleted netns $PREFIX-$m"
done
ip link del "$BRIDGE" 2>/dev/null && log "deleted bridge $BRIDGE"
if [[ ${SLURM_2NODE_WIPE:-0} == 1 && -d $DIR ]]; then log "removing $DIR"; rm -rf "$DIR"; fi
exit 0
