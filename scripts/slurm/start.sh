#!/usr/bin/env bash
# A one-node Slurm on this host, for tests: installs Debian's slurm-wlm + munge, writes a
# slurm.conf (this host, its CPUs, `hostname -s`), starts munged, slurmctld and slurmd, and waits
# until the node is idle. Idempotent: a second run only (re)starts what is not running.
#   bash scripts/slurm/start.sh          # install if needed, start, print `sinfo`
#   bash scripts/slurm/start.sh --stop   # stop the three daemons this script started
# Needs root (or sudo) and apt access to Debian. No systemd is assumed (containers have none).
set -euo pipefail
CONF_DIR=/etc/slurm
STATE=/var/spool/slurm-hpctrain
LOG=/var/log/slurm-hpctrain
say() { printf '[slurm] %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

stop() {
  for name in slurmd slurmctld; do
    [ -f "$STATE/$name.pid" ] && as_root kill "$(cat "$STATE/$name.pid")" 2>/dev/null || true
  done
  [ -f /run/munge/munged.pid ] && as_root kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
  say "stopped"
}
[ "${1:-}" = "--stop" ] && { stop; exit 0; }

# 1. Packages (about 30 s, once). policy-rc.d keeps postinst scripts from starting daemons.
debs="slurm-wlm slurm-client munge"
if ! dpkg -s $debs >/dev/null 2>&1; then
  say "installing Debian packages: $debs"
  as_root sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d'
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $debs >/dev/null
  as_root rm -f /usr/sbin/policy-rc.d
fi

# 2. munge: a key, then the daemon as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
  as_root mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
    || as_root dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  as_root chown munge:munge /etc/munge/munge.key && as_root chmod 400 /etc/munge/munge.key
fi
as_root mkdir -p /run/munge /var/log/munge /var/lib/munge
as_root chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n </dev/null >/dev/null 2>&1; then
  say "starting munged"
  as_root runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
fi

# 3. slurm.conf: one node (this host), linuxproc tracking (no cgroups in containers), root as
#    SlurmUser, finished jobs kept 1 h so `scontrol show job` reports their exit state.
host=$(hostname -s)
cpus=$(getconf _NPROCESSORS_ONLN)   # not nproc: it honours OMP_NUM_THREADS, which make exports as 1
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
as_root mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" "$LOG"
conf=$(cat <<CONF
# Written by hpctrain scripts/slurm/start.sh: a one-node test cluster on $host.
ClusterName=hpctrain
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=30
InactiveLimit=0
SlurmdTimeout=300
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
if [ "$(cat "$CONF_DIR/slurm.conf" 2>/dev/null)" != "$conf" ]; then
  printf '%s\n' "$conf" | as_root tee "$CONF_DIR/slurm.conf" >/dev/null
  fresh=1
fi

# 4. Daemons (they fork into the background themselves).
running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }
if [ -n "${fresh:-}" ]; then running slurmd && as_root kill "$(cat "$STATE/slurmd.pid")"; \
  running slurmctld && as_root kill "$(cat "$STATE/slurmctld.pid")"; sleep 1; fi
running slurmctld || { say "starting slurmctld"; as_root slurmctld -i; }
running slurmd || { say "starting slurmd"; as_root slurmd; }

# 5. Wait until the node takes jobs.
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  case "$state" in
    idle*|mixed*|allocated*) sinfo; exit 0 ;;
    down*|drain*) as_root scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
  esac
  sleep 1
done
say "node $host did not become idle (state: ${state:-unknown}); see $LOG/*.log"
exit 1
