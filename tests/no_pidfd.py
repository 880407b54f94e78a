#!/usr/bin/python3
"""Runs a command as on a kernel older than 5.3: the pidfd system calls fail with ENOSYS.

    /usr/bin/python3 tests/no_pidfd.py --log FILE -- COMMAND [ARG...]

RHEL/Rocky 8 nodes run Linux 4.18, which has no pidfd_open (5.3),
pidfd_send_signal (5.1) nor pidfd_getfd (5.6). tests/old_kernel.rs runs
gpureap under this wrapper to show that its fallbacks work there, for real:
a seccomp filter (libseccomp's Python bindings, Debian python3-seccomp)
sends every one of these calls, by COMMAND and everything it starts, to a
listener that writes one line per call to FILE ("pidfd_open 4242": the
call, the caller's PID) and then answers ENOSYS, as the old kernel would.
The log shows that the pidfd path was tried and refused, so a test can fail
when the program never tried it or the filter did not apply.

The command runs with this process's PID (exec), so whoever started the
wrapper can signal and wait for the command as if it were started directly.
The listener is a separate process outside the command's process tree (it
must not look like one of the command's children to a supervisor); it ends
when nothing that runs under the filter is left. Should it ever be gone
early, the kernel answers ENOSYS itself.

Use /usr/bin/python3: python3-seccomp is installed for Debian's Python, and
a python3 earlier on PATH (pyenv) may not have it.
"""

import errno
import fcntl
import os
import select
import socket
import struct
import sys
import time

import seccomp

CALLS = ("pidfd_open", "pidfd_send_signal", "pidfd_getfd")

# linux/seccomp.h: struct seccomp_notif is 80 bytes (id, pid, flags, then
# seccomp_data: nr, arch, instruction_pointer, args[6]); struct
# seccomp_notif_resp is 24 (id, val, error, flags). _IOWR('!', 0 or 1, size).
NOTIF_SIZE = 80
RESP_FORMAT = "=QqiI"
IOCTL_RECV = (3 << 30) | (NOTIF_SIZE << 16) | (ord("!") << 8) | 0
IOCTL_SEND = (3 << 30) | (struct.calcsize(RESP_FORMAT) << 16) | (ord("!") << 8) | 1

# A listener that outlives everything it serves by this long gives up.
LISTENER_LIFETIME_S = 3600


def fail(message):
    print(f"no_pidfd.py: {message}", file=sys.stderr)
    sys.exit(125)


def parse(argv):
    if len(argv) < 4 or argv[0] != "--log" or argv[2] != "--":
        fail("usage: no_pidfd.py --log FILE -- COMMAND [ARG...]")
    return argv[1], argv[3:]


def listen(channel, log_path):
    """The listener: answers each notified call with ENOSYS and logs it."""
    names = {seccomp.resolve_syscall(seccomp.Arch.NATIVE, name): name for name in CALLS}
    _, fds, _, _ = socket.recv_fds(channel, 1, 1)
    channel.close()
    if not fds:
        os._exit(1)
    listener = fds[0]
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    deadline = time.monotonic() + LISTENER_LIFETIME_S
    with open(log_path, "a", buffering=1) as log:
        while time.monotonic() < deadline:
            events = poller.poll(1000)
            if any(event & (select.POLLHUP | select.POLLERR) for _, event in events):
                break  # nothing runs under the filter any more
            if not events:
                continue
            notification = bytearray(NOTIF_SIZE)
            try:
                fcntl.ioctl(listener, IOCTL_RECV, notification, True)
            except OSError as error:
                if error.errno in (errno.ENOENT, errno.EINTR):
                    continue  # the caller died before we read it
                raise
            call_id, pid, _flags, nr = struct.unpack_from("=QIIi", notification)
            log.write(f"{names.get(nr, nr)} {pid}\n")
            response = struct.pack(RESP_FORMAT, call_id, 0, -errno.ENOSYS, 0)
            try:
                fcntl.ioctl(listener, IOCTL_SEND, response)
            except OSError as error:
                if error.errno != errno.ENOENT:
                    raise
    os._exit(0)


def main():
    log_path, command = parse(sys.argv[1:])
    open(log_path, "a").close()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    middle = os.fork()
    if middle == 0:
        # Fork twice, so the listener is nobody's child in the command's tree,
        # and leave the caller's terminal and pipes alone.
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        ours.close()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            listen(theirs, log_path)
        except BaseException as error:  # noqa: BLE001 - the log is the only place left to say it
            with open(log_path, "a") as log:
                log.write(f"listener failed: {error!r}\n")
        os._exit(1)
    theirs.close()
    os.waitpid(middle, 0)

    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in CALLS:
        rules.add_rule(seccomp.NOTIFY, name)
    try:
        rules.load()
    except OSError as error:
        fail(f"cannot load the seccomp filter: {error}")
    listener = rules.get_notify_fd()
    socket.send_fds(ours, [b"x"], [listener])
    ours.close()
    os.close(listener)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        fail(f"cannot run {command[0]}: {error}")


if __name__ == "__main__":
    main()
