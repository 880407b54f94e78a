"""A crowd of idle processes, each with about ten open files, to make /proc big.

    python3 bench/crowd.py N READY_FILE

Starts N `sleep` processes that share ten open files (five on /dev/null, five
on this script) besides stdin, stdout and stderr: thirteen descriptors each,
as a small Python worker has. They are spawned (posix_spawn), not forked
Python interpreters, so that 20,000 of them fit in about 2.5 GiB: a forked
interpreter dirties some 750 KiB of its own. Touches READY_FILE once all are
up; ends them all (SIGKILL, only those it started) on SIGTERM. A crowd left
behind by a killed benchmark ends by itself after two hours. Used by
bench/bench.py.
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time


@contextlib.contextmanager
def running(count):
    """This script's crowd of COUNT processes, started in a child of the
    caller and up when the block begins; ended (SIGTERM) when it ends,
    however it ends. COUNT 0 starts nothing (the block gets None)."""
    if not count:
        yield None
        return
    ready = tempfile.mktemp(prefix="gpureap-crowd-")
    crowd = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(count), ready])
    try:
        while not os.path.exists(ready):
            if crowd.poll() is not None:
                raise SystemExit(f"bench/crowd.py could not start {count} processes")
            time.sleep(0.05)
        yield crowd
    finally:
        crowd.send_signal(signal.SIGTERM)
        crowd.wait()
        if os.path.exists(ready):
            os.unlink(ready)


def main():
    count, ready = int(sys.argv[1]), sys.argv[2]
    files = [os.open("/dev/null", os.O_RDONLY) for _ in range(5)]
    files += [os.open(sys.argv[0], os.O_RDONLY) for _ in range(5)]
    for descriptor in files:
        os.set_inheritable(descriptor, True)
    children = []

    def stop(*_):
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for child in children:
            try:
                os.waitpid(child, 0)
            except ChildProcessError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    sleep = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"
    for _ in range(count):
        children.append(os.posix_spawn(sleep, ["sleep", "7200"], os.environ))
    time.sleep(0.2)
    open(ready, "w").close()
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
