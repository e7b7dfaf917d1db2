#!/usr/bin/env bash
# Bring up a real one-node SLURM on this machine (slurmctld + slurmd + munge), as ../shared/reference/slurm-one-node.md
# describes: Debian packages, munge key, a minimal slurm.conf with one node and one partition `debug`.
# Exit 0 with SLURM up; exit 3 when apt-get is unavailable (the caller skips); any other failure is an error.
set -euo pipefail
t0=$(date +%s)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "slurm-up: apt-get (as root) unavailable here; skipping the SLURM tests"; exit 3
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(free -m | awk '/^Mem:/{print $2}') * 9 / 10 ))
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge /var/lib/munge
install -d -o munge -g munge -m 0755 /var/run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c munged
munge -n | unmunge >/dev/null
install -d /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /etc/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=gpuscope-ci
SlurmctldHost=${host}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/var/run/slurmctld.pid
SlurmdPidFile=/var/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${host} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=60 State=UP
CONF
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 30); do
  if sinfo -h -o '%T' 2>/dev/null | grep -q idle; then
    echo "slurm-up: one-node SLURM (partition debug, ${cpus} CPUs) up in $(( $(date +%s) - t0 )) s"; exit 0
  fi
  sleep 1
done
echo "slurm-up: the node did not become idle; last log lines:"; tail -5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log
exit 1
