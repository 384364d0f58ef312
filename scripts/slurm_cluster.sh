#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, from Debian's packages (slurm-wlm, munge), for
# trying `attnbench run ... hydra/launcher=submitit_slurm` and for tests/test_slurm.py
# (docs/cluster.md). Without systemd: munged, slurmctld and slurmd are started directly, as
# root, with a minimal slurm.conf of their own (no accounting daemon; jobs share the node by
# CPU and memory: select/cons_tres, CR_CPU_Memory, DefMemPerCPU; task/affinity pins a task
# to its CPUs). Nothing in /etc/slurm is touched: clients find the cluster by SLURM_CONF.
#
#   eval "$(scripts/slurm_cluster.sh up)"   # start it; prints `export SLURM_CONF=...`
#   scripts/slurm_cluster.sh status         # sinfo and squeue, or exit 1 when it is not up
#   scripts/slurm_cluster.sh down           # stop what `up` started and remove its directory
#
# Its files (slurm.conf, state, spool, logs) live in $ATTNBENCH_SLURM_DIR
# (default /tmp/attnbench-slurm).
set -euo pipefail
DIR=${ATTNBENCH_SLURM_DIR:-/tmp/attnbench-slurm}
CONF=$DIR/slurm.conf
say() { echo "slurm_cluster: $*" >&2; }
die() { say "error: $*"; exit 2; }
# `up` waits for munged and the node to be ready however long load makes it (seconds, on a
# quiet machine or a loaded one); this guard is against a true hang only, which no load nears
HANG_S=600

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (the daemons run as root): sudo $0 $1"
}

# the pid in FILE, if that process is alive
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
    need_root up
    for bin in munged slurmctld slurmd sinfo; do
        command -v "$bin" >/dev/null || die "$bin not found: apt-get install slurm-wlm munge"
    done
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
        say "already up ($CONF)"
        echo "export SLURM_CONF=$CONF"
        return
    fi
    mkdir -p "$DIR/state" "$DIR/spool"

    # munge: the daemon SLURM authenticates with; one already running is used as it is
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
        install -d -o munge -g munge -m 0755 /run/munge
        install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
        runuser -u munge -- munged
        touch "$DIR/munged.ours"  # so that `down` stops it
        local guard=$((SECONDS + HANG_S))
        until munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || [ $SECONDS -ge "$guard" ]; do
            sleep 0.1
        done
        munge -n | unmunge >/dev/null || die "munged did not start"
    fi

    local host cpus mem defmem
    host=$(hostname -s)
    cpus=$(nproc --all)
    # slurmd's own view of the memory (MB), less 5 % for the system
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
    mem=$((mem * 95 / 100))
    defmem=$((mem / cpus < 2048 ? mem / cpus : 2048))
    cat >"$CONF" <<EOF
# written by scripts/slurm_cluster.sh: a single-node test cluster
ClusterName=attnbench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# no cgroups needed: processes tracked by their parentage, tasks pinned to their CPUs
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
# jobs share the node: CPUs and memory are what is allocated
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$defmem
# no accounting daemon: sacct has nothing to ask
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
# a cancelled job gets SIGTERM, then SIGKILL this many seconds later (SLURM's default: 30)
KillWait=5
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$CONF
    slurmctld -f "$CONF"
    slurmd -f "$CONF"
    local state="" guard=$((SECONDS + HANG_S)) d
    while [ $SECONDS -lt "$guard" ]; do
        state=$(sinfo -h -N -o %T 2>/dev/null | head -1) || true
        case $state in idle | mixed | allocated) break ;; esac
        for d in slurmctld slurmd; do  # one that has died is not waited for
            if [ -s "$DIR/$d.pid" ] && ! alive "$DIR/$d.pid"; then break 2; fi
        done
        sleep 0.1
    done
    case $state in
        idle | mixed | allocated) ;;
        *) die "node not ready (state '${state:-none}'); see $DIR/slurmctld.log and $DIR/slurmd.log" ;;
    esac
    say "up: node $host, $cpus CPUs, ${mem} MB (${defmem} MB per CPU by default), partition debug"
    echo "export SLURM_CONF=$CONF"
}

# stop the daemon whose pid is in FILE and wait for it to go (10 s, then SIGKILL)
stop() {
    alive "$1" || return 0
    local pid
    pid=$(cat "$1")
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

down() {
    need_root down
    [ -d "$DIR" ] || { say "not up (no $DIR)"; return; }
    if alive "$DIR/slurmctld.pid"; then  # no job outlives the cluster (slurmd would leave it)
        export SLURM_CONF=$CONF
        local jobs
        jobs=$(squeue --noheader --format=%A 2>/dev/null | sort -u)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            scancel $jobs || true
            for _ in $(seq 150); do  # KillWait, then the jobs' end
                [ -z "$(squeue --noheader 2>/dev/null)" ] && break
                sleep 0.1
            done
        fi
    fi
    stop "$DIR/slurmd.pid"
    stop "$DIR/slurmctld.pid"
    [ -e "$DIR/munged.ours" ] && stop /run/munge/munged.pid
    rm -rf "$DIR"
    say "down"
}

status() {
    [ -f "$CONF" ] || { say "not up (no $CONF)"; exit 1; }
    export SLURM_CONF=$CONF
    sinfo && squeue
}

case ${1:-} in
    up | down | status) "$1" ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
