#!/bin/sh
# A stand-in for ssh to this very machine that adds a fixed latency: the
# fleet part of bench/bench.py uses it for 64 and 256 hosts, which this
# machine cannot stage as real sshd hosts (bench/sshd_lab.py stages 8).
#
#     bench/lagged_ssh.sh SECONDS SSH_ARGUMENTS...
#     gpureap status -H 'h[1-256]' --ssh "bench/lagged_ssh.sh 0.25"
#
# It drops ssh's options (-o X, -oX, -T, -F FILE ...) and takes the first
# other word as the host, as scripts/fake_ssh.py does, sleeps SECONDS (the
# connection's latency, measured on real sshd hosts by the benchmark), then
# runs the rest with `sh -c`, here, in its own place (exec: stdin, stdout,
# stderr and the exit code pass through). A shell, not Python: at 256 hosts
# an interpreter's start-up (~0.1 s of CPU each here) would be the whole
# measurement. gpureap's own GPUREAP_ settings are dropped, as ssh drops them.
latency=$1
shift
while [ $# -gt 0 ]; do
    case $1 in
        --) shift; break ;;
        -[BbcDEeFIiJLlmOopQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "lagged_ssh: no host given" >&2; exit 255; }
shift
sleep "$latency"
for name in $(env | sed -n 's/^\(GPUREAP_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$name"; done
exec sh -c "$*"
