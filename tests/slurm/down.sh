#!/usr/bin/env bash
# Stop the daemons tests/slurm/up.sh started, by their pid files, so a later run starts clean.
for f in /var/run/slurmd.pid /var/run/slurmctld.pid; do
  [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null
done
pkill -x munged 2>/dev/null || true
exit 0
