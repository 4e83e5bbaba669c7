#!/usr/bin/env bash
# A small Slurm cluster on this host (one slurmctld, NODES slurmd), for tests and for
# trying the Slurm launch path.
#
#   .ci/slurm/local-cluster.sh start    install (if needed) and start munged, slurmctld, slurmds
#   .ci/slurm/local-cluster.sh stop     stop the daemons this script started
#   .ci/slurm/local-cluster.sh status   print what runs and the nodes' states
#
# Needs root and Debian/Ubuntu (slurm-wlm and munge come from the distribution's
# packages). No systemd, cgroups or database is needed.
#
# Settings (environment): PLEXUS_SLURM_NODES (2), PLEXUS_SLURM_CPUS (16, per node),
# PLEXUS_SLURM_STATE, PLEXUS_SLURM_LOGS (paths below), PLEXUS_SLURM_START_TIMEOUT (60 s).
#
# Paths:
#   STATE=/run/plexus-tune/slurm      owned by this script; removed by nothing
#     slurm.conf                      the configuration (see below)
#     slurmctld.pid, slurmd-NODE.pid  pid files of the daemons
#     munged.pid                      written only when this script started munged
#     munge/                          munged's own pid file and log (munged.log); owned
#                                     by the munge user, as munged runs as that user
#     ctld/                           StateSaveLocation of slurmctld
#     spool-NODE/                     SlurmdSpoolDir of each node (batch scripts, step sockets)
#   LOGS=/var/log/plexus-tune
#     slurmctld.log, slurmd-NODE.log  daemon logs
#     jobcomp.log                     one line per finished job (jobcomp/filetxt):
#                                     JobId, JobState, ExitCode, NodeList, times...
#   /etc/slurm/slurm.conf             a symbolic link to STATE/slurm.conf, so that sbatch,
#                                     squeue, scontrol... find it without SLURM_CONF; left
#                                     alone (and SLURM_CONF must be exported) if it exists
#                                     and is not such a link
#   /etc/munge/munge.key              created (mungekey) when missing
#
# The nodes: NODES slurmd daemons on this host, all reached at 127.0.0.1 (each on its
# own port, 6818, 6819, ...), named $(hostname) and $(hostname)-2, -3, ... (slurmd -N
# NAME; Debian's Slurm is built with multiple-slurmd support). Partitions:
#   local (default)  the first node only, $(hostname): single-node jobs always land on a
#                    node whose name resolves, which the trainer's MASTER_ADDR needs
#   multi            all nodes, for multi-node jobs and steps (sbatch -p multi -N 2 ...);
#                    the first host of their node list is again $(hostname). Only the
#                    first node's name resolves (it is the host name): a job placed on
#                    the other nodes alone cannot use its node name as an address.
# Each node is declared with CPUS CPUs whatever the host has (default 16), so that tests
# can start 8 or 16 tasks on a 2-core machine (SlurmdParameters=config_overrides keeps
# slurmd from draining a node for having fewer CPUs than declared), and with RealMemory
# from /proc/meminfo. Scheduling: select/cons_tres with CR_CPU (CPUs only; memory is not
# a consumable, so jobs need no --mem); EnforcePartLimits=ALL makes sbatch reject a job
# that no partition could ever run instead of leaving it pending. No cgroups:
# ProctrackType=proctrack/linuxproc and TaskPlugin=task/none, so no CPU binding or
# memory limits are enforced (srun notes that the cluster lacks cpu binding support).
#
# Final job states: there is no slurmdbd (it needs a MariaDB server), so sacct does not
# work. Finished jobs stay in slurmctld's memory for MinJobAge=3600 s, where
# `scontrol show job -o ID` gives JobState, Reason and ExitCode (exit:signal) of jobs
# and array tasks. jobcomp.log has JobState, ExitCode and DerivedExitCode (the highest
# exit code of the job's steps; scontrol does not show it without accounting), and
# keeps them after slurmctld has forgotten the job. plexus_tune.launch.slurm reads
# scontrol first, then jobcomp.log (found through `scontrol show config`). The final
# states of individual job steps are kept nowhere (that needs slurmdbd): a failing
# step shows in the job's DerivedExitCode and, with srun --kill-on-bad-exit=1 under
# `set -e`, in the job's own FAILED state.
#
# Network namespaces are not used: the nodes share the host's network and file system,
# which is enough for Slurm's bookkeeping of several nodes (distinct SLURMD_NODENAME,
# SLURM_NODEID, multi-node steps), not for testing anything that depends on real
# separate hosts (node-local files, interfaces).
set -euo pipefail

STATE=${PLEXUS_SLURM_STATE:-/run/plexus-tune/slurm}
LOGS=${PLEXUS_SLURM_LOGS:-/var/log/plexus-tune}
CPUS=${PLEXUS_SLURM_CPUS:-16}
NODES=${PLEXUS_SLURM_NODES:-2}
START_TIMEOUT=${PLEXUS_SLURM_START_TIMEOUT:-60}
CONF=$STATE/slurm.conf
SYSTEM_CONF=/etc/slurm/slurm.conf
MUNGE_KEY=/etc/munge/munge.key
MUNGE_SOCKET=/run/munge/munge.socket.2
HOST=$(hostname -s)
case "$NODES" in ''|*[!0-9]*|0) echo "local-cluster: PLEXUS_SLURM_NODES must be a positive integer" >&2; exit 2 ;; esac
NODE_NAMES=("$HOST")
for ((n = 2; n <= NODES; n++)); do NODE_NAMES+=("$HOST-$n"); done

log() { echo "local-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

# pid from a pid file when that process is alive, else nothing
live_pid() {
    local file=$1 pid
    [ -f "$file" ] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

show_logs() {
    local f
    for f in "$STATE/munge/munged.log" "$LOGS/slurmctld.log" "$LOGS"/slurmd-*.log; do
        [ -f "$f" ] || continue
        echo "---- last lines of $f" >&2
        tail -n 25 "$f" >&2
    done
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return
    fi
    [ "$(id -u)" = 0 ] || die "slurm-wlm is not installed and installing it needs root"
    command -v apt-get >/dev/null || die "slurm-wlm is not installed and there is no apt-get"
    log "installing slurm-wlm and munge from the distribution's packages"
    local t0=$SECONDS policy=/usr/sbin/policy-rc.d own_policy=0
    # keep the packages' maintainer scripts from starting daemons with the packaged
    # configuration; this script starts them with its own
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    local rc=0
    {
        apt-get update -q \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                slurm-wlm munge
    } >"$STATE/apt.log" 2>&1 || rc=$?
    [ "$own_policy" = 1 ] && rm -f "$policy"
    if [ "$rc" != 0 ]; then
        tail -n 30 "$STATE/apt.log" >&2
        die "apt-get failed (full log: $STATE/apt.log)"
    fi
    log "installed in $((SECONDS - t0)) s"
}

write_config() {
    local mem_mb
    mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    local name n=0 nodes_conf="" all
    mkdir -p "$STATE/ctld" "$LOGS"
    for name in "${NODE_NAMES[@]}"; do
        mkdir -p "$STATE/spool-$name"
        nodes_conf+="NodeName=$name NodeAddr=127.0.0.1 NodeHostname=$HOST Port=$((6818 + n)) CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN"$'\n'
        n=$((n + 1))
    done
    all=$(IFS=,; echo "${NODE_NAMES[*]}")
    cat >"$CONF.new" <<EOF
# written by .ci/slurm/local-cluster.sh; rewritten on every start
ClusterName=plexus-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
EnforcePartLimits=ALL
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=5
MailProg=/bin/true
InactiveLimit=0
Waittime=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
${nodes_conf}PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=multi Nodes=$all MaxTime=INFINITE State=UP
EOF
    mv "$CONF.new" "$CONF"
    if [ -L "$SYSTEM_CONF" ] && [ "$(readlink "$SYSTEM_CONF")" = "$CONF" ]; then
        :
    elif [ -e "$SYSTEM_CONF" ] || [ -L "$SYSTEM_CONF" ]; then
        log "warning: $SYSTEM_CONF exists and is not ours; export SLURM_CONF=$CONF for the clients"
    else
        mkdir -p "$(dirname "$SYSTEM_CONF")"
        ln -s "$CONF" "$SYSTEM_CONF"
    fi
}

start_munge() {
    if [ -S "$MUNGE_SOCKET" ] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return  # a working munged, ours or not
    fi
    if [ ! -s "$MUNGE_KEY" ]; then
        log "creating $MUNGE_KEY"
        mkdir -p "$(dirname "$MUNGE_KEY")"
        mungekey --create --keyfile="$MUNGE_KEY"
    fi
    chown munge:munge "$MUNGE_KEY" && chmod 400 "$MUNGE_KEY"
    # munged runs as the munge user: its pid file and log go to a directory it owns
    mkdir -p /run/munge /var/lib/munge "$STATE/munge"
    chown munge:munge /run/munge /var/lib/munge "$STATE/munge"
    chmod 755 /run/munge
    rm -f "$STATE/munge/munged.pid"
    runuser -u munge -- munged --pid-file="$STATE/munge/munged.pid" \
        --log-file="$STATE/munge/munged.log" --socket="$MUNGE_SOCKET"
    for _ in $(seq 50); do
        if live_pid "$STATE/munge/munged.pid" >/dev/null \
            && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
            cp "$STATE/munge/munged.pid" "$STATE/munged.pid"
            return
        fi
        sleep 0.1
    done
    show_logs
    die "munged did not start"
}

# "NAME STATE" lines of our nodes
node_states() {
    local all
    all=$(IFS=,; echo "${NODE_NAMES[*]}")
    SLURM_CONF=$CONF timeout 10 sinfo -h -N -n "$all" -o '%N %T' 2>/dev/null | sort -u
}

# one line: "vm idle, vm-2 idle"
summary() {
    local states
    live_pid "$STATE/slurmctld.pid" >/dev/null || { echo "slurmctld not running"; return; }
    states=$(node_states || true)
    [ -n "$states" ] || { echo "no node reported"; return; }
    echo "$states" | paste -sd, - | sed 's/,/, /g'
}

wait_idle() {
    local deadline=$((SECONDS + START_TIMEOUT)) states="" name state ready
    while [ "$SECONDS" -lt "$deadline" ]; do
        states=$(node_states || true)
        ready=0
        while read -r name state; do
            case "$state" in
                idle* | mixed* | allocated* | completing*) ready=$((ready + 1)) ;;
                down* | drain*)
                    SLURM_CONF=$CONF scontrol update nodename="$name" state=resume 2>/dev/null || true ;;
            esac
        done <<<"$states"
        [ "$ready" -ge "$NODES" ] && return 0
        sleep 0.5
    done
    show_logs
    die "nodes not all idle after ${START_TIMEOUT} s: ${states:-none reported} (logs above)"
}

all_running() {
    local name
    live_pid "$STATE/slurmctld.pid" >/dev/null || return 1
    for name in "${NODE_NAMES[@]}"; do
        live_pid "$STATE/slurmd-$name.pid" >/dev/null || return 1
    done
}

cmd_start() {
    mkdir -p "$STATE" "$LOGS"
    if all_running; then
        log "already running: $(summary)"
        return
    fi
    local t0=$SECONDS name
    install_packages
    write_config
    start_munge
    if ! live_pid "$STATE/slurmctld.pid" >/dev/null; then
        SLURM_CONF=$CONF slurmctld -f "$CONF" || { show_logs; die "slurmctld did not start"; }
    fi
    for name in "${NODE_NAMES[@]}"; do
        if ! live_pid "$STATE/slurmd-$name.pid" >/dev/null; then
            SLURM_CONF=$CONF slurmd -f "$CONF" -N "$name" || { show_logs; die "slurmd $name did not start"; }
        fi
    done
    wait_idle
    log "started in $((SECONDS - t0)) s: $(summary); $CPUS CPUs each; config $CONF"
}

stop_pidfile() {
    local name=$1 file=$2 pid
    if pid=$(live_pid "$file"); then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "$name ($pid) still runs after 10 s; killing it"
            kill -9 "$pid" 2>/dev/null || true
        fi
        log "stopped $name ($pid)"
    fi
    rm -f "$file"
}

cmd_stop() {
    local file
    # every slurmd this script started, also those of a larger PLEXUS_SLURM_NODES
    for file in "$STATE"/slurmd-*.pid; do
        [ -e "$file" ] || continue
        file=${file##*/}
        stop_pidfile "${file%.pid}" "$STATE/$file"
    done
    stop_pidfile slurmctld "$STATE/slurmctld.pid"
    # munged only when this script started it
    stop_pidfile munged "$STATE/munged.pid"
}

cmd_status() {
    local name pid rc=0
    for name in munged slurmctld "${NODE_NAMES[@]/#/slurmd-}"; do
        if pid=$(live_pid "$STATE/$name.pid"); then
            echo "$name: running ($pid)"
        else
            echo "$name: not started by this script"
            [ "$name" = munged ] || rc=3
        fi
    done
    echo "nodes: $(summary)"
    echo "config: $CONF"
    return "$rc"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
