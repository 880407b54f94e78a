"""A crowd of idle processes, each with about ten open files, to make /proc big.

    python3 bench/crowd.py N READY_FILE

Forks N children (copy-on-write: cheap in memory); each opens ten files and
waits for a signal. Touches READY_FILE once all are up; ends them all on
SIGTERM. Used by bench/bench.py.
"""

import os
import signal
import sys
import time


def main():
    count, ready = int(sys.argv[1]), sys.argv[2]
    children = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            files = [os.open("/dev/null", os.O_RDONLY) for _ in range(5)]
            files += [os.open(sys.argv[0], os.O_RDONLY) for _ in range(5)]
            while True:
                signal.pause()
        children.append(pid)

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
    time.sleep(0.2)
    open(ready, "w").close()
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
