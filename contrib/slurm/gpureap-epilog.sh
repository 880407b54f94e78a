#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpureap-epilog.sh   (docs/slurm.md)
# slurmd runs this as root after every job, with no PATH. gpureap frees what
# the job left on its GPUs; exit 1 (node drained, reason "gpureap: ...") when
# a GPU stays held. It ends itself within --timeout (default 30s).
# Add --reset to reset a GPU that only driver-held memory keeps (never one in use).
exec /usr/local/bin/gpureap slurm epilog --log /var/log/gpureap/slurm.jsonl "$@"
