#!/usr/bin/env bash
# PID 1 of one two-node-cluster machine (see two-node-up.sh): runs inside the machine's own
# network, UTS, mount and PID namespaces, sets its hostname, points /etc/hosts at the cluster's
# hosts file (only inside this mount namespace), then runs the daemon in the foreground.
# SIGTERM is passed to the daemon; when the daemon exits, this script exits and the kernel kills
# every process left in the PID namespace (job steps, Ray): the machine is "powered off".
#   node-init.sh HOSTNAME HOSTS_FILE DAEMON [ARGS...]
set -u
hostname "$1"
mount --bind "$2" /etc/hosts
shift 2
"$@" &
daemon=$!
trap 'kill -TERM "$daemon" 2>/dev/null' TERM INT
# As PID 1, bash also reaps the orphans re-parented to it (daemonized job processes).
while kill -0 "$daemon" 2>/dev/null; do wait "$daemon"; done
