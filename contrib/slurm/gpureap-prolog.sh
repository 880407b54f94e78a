#!/bin/sh
# slurm.conf: Prolog=/etc/slurm/gpureap-prolog.sh   (docs/slurm.md)
# Before a job starts: its GPUs must be clean (waits up to --wait for a release
# in progress), else the node is drained and Slurm requeues the job elsewhere.
exec /usr/local/bin/gpureap slurm prolog --log /var/log/gpureap/slurm.jsonl "$@"
