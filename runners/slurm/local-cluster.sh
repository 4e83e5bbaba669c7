#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for tests and for trying the Slurm launch path.
#
#   runners/slurm/local-cluster.sh start    install (if needed) and start munged, slurmctld, slurmd
#   runners/slurm/local-cluster.sh stop     stop the daemons this script started
#   runners/slurm/local-cluster.sh status   print what runs and the node's state
#
# Needs root and Debian/Ubuntu (slurm-wlm and munge come from the distribution's
# packages). No systemd, cgroups or database is needed.
#
# Paths (STATE can be moved with PLEXUS_SLURM_STATE, LOGS with PLEXUS_SLURM_LOGS):
#   STATE=/run/plexus-tune/slurm      owned by this script; removed by nothing
#     slurm.conf                      the configuration (see below)
#     slurmctld.pid, slurmd.pid       pid files of the daemons
#     munged.pid                      written only when this script started munged
#     munge/                          munged's own pid file and log (munged.log); owned
#                                     by the munge user, as munged runs as that user
#     ctld/                           StateSaveLocation of slurmctld
#     spool/                          SlurmdSpoolDir (batch scripts, step sockets)
#   LOGS=/var/log/plexus-tune
#     slurmctld.log, slurmd.log       daemon logs
#     jobcomp.log                     one line per finished job (jobcomp/filetxt):
#                                     JobId, JobState, ExitCode, NodeList, times...
#   /etc/slurm/slurm.conf             a symbolic link to STATE/slurm.conf, so that sbatch,
#                                     squeue, scontrol... find it without SLURM_CONF; left
#                                     alone (and SLURM_CONF must be exported) if it exists
#                                     and is not such a link
#   /etc/munge/munge.key              created (mungekey) when missing
#
# The node: NodeName=$(hostname), reached at 127.0.0.1, declared with CPUS (default 16,
# env PLEXUS_SLURM_CPUS) CPUs whatever the host has, so that tests can start 8 or 16
# tasks on a 2-core machine (SlurmdParameters=config_overrides keeps slurmd from
# draining the node for having fewer CPUs than declared), and with RealMemory from
# /proc/meminfo. Scheduling: select/cons_tres with CR_CPU (CPUs only; memory is not a
# consumable, so jobs need no --mem). ProctrackType=proctrack/linuxproc and
# TaskPlugin=task/none: no cgroups, so no CPU binding or memory limits are enforced.
#
# Final job states: there is no slurmdbd (it needs a MariaDB server), so sacct does not
# work. Finished jobs stay in slurmctld's memory for MinJobAge=3600 s, where
# `scontrol show job -o ID` gives JobState, Reason, ExitCode (exit:signal) and
# DerivedExitCode (the highest exit code of its steps); plexus_tune.launch_slurm reads
# that. jobcomp.log keeps the final state of every job past that hour. The final states
# of individual job steps are not kept anywhere (that needs slurmdbd); a failing step
# shows in the job's DerivedExitCode and, with srun --kill-on-bad-exit=1 under
# `set -e`, in the job's own FAILED state.
#
# One node only: several slurmd on one host need a Slurm built with
# --enable-multiple-slurmd (slurmd -N NAME), and Debian's slurmd is not (`slurmd -N x`
# is rejected as an invalid option); network namespaces would not help, since each
# slurmd would still be the same build. Multi-node steps are therefore not tested here.
set -euo pipefail

STATE=${PLEXUS_SLURM_STATE:-/run/plexus-tune/slurm}
LOGS=${PLEXUS_SLURM_LOGS:-/var/log/plexus-tune}
CPUS=${PLEXUS_SLURM_CPUS:-16}
START_TIMEOUT=${PLEXUS_SLURM_START_TIMEOUT:-60}
CONF=$STATE/slurm.conf
SYSTEM_CONF=/etc/slurm/slurm.conf
MUNGE_KEY=/etc/munge/munge.key
MUNGE_SOCKET=/run/munge/munge.socket.2
HOST=$(hostname -s)

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
    for f in "$STATE/munge/munged.log" "$LOGS/slurmctld.log" "$LOGS/slurmd.log"; do
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
    mkdir -p "$STATE/ctld" "$STATE/spool" "$LOGS"
    cat >"$CONF.new" <<EOF
# written by runners/slurm/local-cluster.sh; rewritten on every start
ClusterName=plexus-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
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
NodeName=$HOST NodeAddr=127.0.0.1 NodeHostname=$HOST CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
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

node_state() {
    SLURM_CONF=$CONF timeout 10 sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n 1
}

wait_idle() {
    local deadline=$((SECONDS + START_TIMEOUT)) state=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        state=$(node_state || true)
        case "$state" in
            idle | mixed | allocated | completing) return 0 ;;
            down* | drain*)
                SLURM_CONF=$CONF scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    show_logs
    die "node $HOST is '${state:-not reported}' after ${START_TIMEOUT} s, not idle (logs above)"
}

cmd_start() {
    mkdir -p "$STATE" "$LOGS"
    if live_pid "$STATE/slurmctld.pid" >/dev/null && live_pid "$STATE/slurmd.pid" >/dev/null; then
        log "already running; node $HOST is $(node_state || echo '?')"
        return
    fi
    local t0=$SECONDS
    install_packages
    write_config
    start_munge
    if ! live_pid "$STATE/slurmctld.pid" >/dev/null; then
        SLURM_CONF=$CONF slurmctld -f "$CONF" || { show_logs; die "slurmctld did not start"; }
    fi
    if ! live_pid "$STATE/slurmd.pid" >/dev/null; then
        SLURM_CONF=$CONF slurmd -f "$CONF" || { show_logs; die "slurmd did not start"; }
    fi
    wait_idle
    log "started in $((SECONDS - t0)) s: node $HOST $(node_state), $CPUS CPUs; config $CONF"
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
    stop_pidfile slurmd "$STATE/slurmd.pid"
    stop_pidfile slurmctld "$STATE/slurmctld.pid"
    # munged only when this script started it
    stop_pidfile munged "$STATE/munged.pid"
}

cmd_status() {
    local name pid rc=0
    for name in munged slurmctld slurmd; do
        if pid=$(live_pid "$STATE/$name.pid"); then
            echo "$name: running ($pid)"
        else
            echo "$name: not started by this script"
            [ "$name" = munged ] || rc=3
        fi
    done
    echo "node $HOST: $(node_state || echo '?')"
    echo "config: $CONF"
    return "$rc"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
