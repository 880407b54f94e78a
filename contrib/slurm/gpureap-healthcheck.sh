#!/bin/sh
# slurm.conf: HealthCheckProgram=/etc/slurm/gpureap-healthcheck.sh   (docs/slurm.md)
# Drains the node when GPU memory is held by no running job's process or by no
# process; resumes a node gpureap drained once it is clean (never an admin's drain).
# If slurmd's NodeName is not the short host name, add --node NAME.
exec /usr/local/bin/gpureap slurm healthcheck --log /var/log/gpureap/slurm.jsonl "$@"
