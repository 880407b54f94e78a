#!/usr/bin/env python3
"""A stand-in for ssh to this very machine, for scripts/gpu_watch_validate.py
on a GPU host that has no sshd.

    python3 scripts/fake_ssh.py [--log FILE] [--state DIR] SSH_ARGUMENTS...

gpureap's fleet commands call `SSH -o BatchMode=yes -o ConnectTimeout=N -T
HOST 'COMMAND'`. This drops ssh's options and the host name and runs the
remote command with `sh -c`, here, as sshd does on the remote side (it execs:
stdin, stdout, stderr and the exit code pass through; 255 is this script's own
failure, as it is ssh's). The command gets this environment less gpureap's
settings (GPUREAP_BACKEND, GPUREAP_SSH: ssh does not carry them).

--log FILE appends "HOST<TAB>COMMAND" for every call, the command on one line
(newlines written `\\n`). --state DIR keeps
`gpureap push`'s record of what it installed in DIR instead of the host's:
for root (whose record is /var/lib/gpureap/pushed) the command runs in a
private mount namespace with DIR bind-mounted on /var/lib; for others
XDG_STATE_HOME is DIR. Without `unshare` (or its permission) as root, it
refuses (exit 255) rather than write the host's record.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpuval as gv  # noqa: E402


def main(argv):
    log = state = None
    while argv[:1] in (["--log"], ["--state"]):
        if len(argv) < 2:
            print(f"fake_ssh: {argv[0]} needs a value", file=sys.stderr)
            return 255
        if argv[0] == "--log":
            log = argv[1]
        else:
            state = argv[1]
        argv = argv[2:]
    try:
        host, command = gv.ssh_remote_command(argv)
    except ValueError as error:
        print(f"fake_ssh: {error}", file=sys.stderr)
        return 255
    if log:
        with open(log, "a") as out:
            # One line a call: the command may span lines (gpureap's watch wrapper).
            out.write(f"{host}\t{command.encode('unicode_escape').decode('ascii')}\n")
    env = gv.remote_env(os.environ)
    run = ["sh", "-c", command]
    if state:
        if os.geteuid() == 0:
            run = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount --bind "$0" /var/lib || exit 255; exec sh -c "$1"', state, command]
        else:
            env["XDG_STATE_HOME"] = state
    try:
        os.execvpe(run[0], run, env)  # the command is this process, as ssh's is to gpureap
    except OSError as error:
        print(f"fake_ssh: {error}", file=sys.stderr)
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
