#!/usr/bin/env python3
"""A lab of real sshd hosts in network namespaces, as tests/sshd_lab.rs
makes them, for the fleet benchmark and for trying `-H` by hand.

    sudo python3 bench/sshd_lab.py 8          # prints the ssh config, then waits
    gpureap status -H 'h[1-8]' --ssh "ssh -F /tmp/gpureap-lab-XXXX/ssh_config"

Each host: a network namespace with a veth pair to this one, and sshd in
its own PID, mount and UTS namespace with its own simulated driver
(2 GPUs) and its own empty /usr/local, /var/lib and /root. Ctrl-C (or closing stdin) tears it all down: the hosts' namespace
inits are killed by PID (which ends every process of that host), then the
network namespaces are deleted. Only what this script made is touched.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


# As in tests/sshd_lab.rs: each host has its own, empty /usr/local, /var/lib
# and /root (tmpfs in its mount namespace), so that what is installed on one
# host (`gpureap push`) is on no other, nor on this machine.
PRIVATE_DIRS = "mount -t tmpfs lab /usr/local && mount -t tmpfs lab /var/lib && mount -t tmpfs lab /root"


def sh(*args):
    subprocess.run(args, check=True, stdin=subprocess.DEVNULL)


class Lab:
    def __init__(self, count, holders_per_host=0, gpus=2):
        assert os.geteuid() == 0, "the lab makes network namespaces: run it as root"
        for path in ("/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen"):
            assert os.path.exists(path), f"{path} missing: apt-get install openssh-server"
        os.makedirs("/run/sshd", exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="gpureap-lab-")
        self.hosts = []
        self.servers = []
        self.netns = []
        pid = os.getpid()
        try:
            self._build(count, pid, gpus)
        except BaseException:
            self.close()
            raise

    def _build(self, count, pid, gpus):
        d = self.dir
        keygen(f"{d}/client")
        shutil.copy(f"{d}/client.pub", f"{d}/authorized_keys")
        config = [
            "Host *", "  User root", f"  IdentityFile {d}/client", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {d}/known_hosts", "  GlobalKnownHostsFile /dev/null",
            "  LogLevel ERROR",
        ]
        known = []
        a = 150 + pid % 50
        for i in range(count):
            name = f"h{i + 1}"
            b, c = i // 64, (i % 64) * 4
            outer_ip, ip = f"10.{a}.{b}.{c + 1}", f"10.{a}.{b}.{c + 2}"
            ns = f"grb{pid}-{i}"
            outer, inner = f"grb{pid}x{i}a", f"grb{pid}x{i}b"
            sh("ip", "netns", "add", ns)
            self.netns.append(ns)
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
            sh("ip", "addr", "add", f"{outer_ip}/30", "dev", outer)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            hd = f"{d}/{name}"
            sim = f"{hd}/sim"
            os.makedirs(f"{sim}/claims")
            for g in range(gpus):
                open(f"{sim}/nvidia{g}", "w").close()
            open(f"{sim}/nvidiactl", "w").close()
            with open(f"{sim}/gpus", "w") as f:
                f.write("".join(f"{80 << 30} NVIDIA H100 80GB HBM3\n" for _ in range(gpus)))
            keygen(f"{hd}/hostkey")
            with open(f"{hd}/hostkey.pub") as f:
                known.append(f"{name} " + " ".join(f.read().split()[:2]))
            config += [f"Host {name}", f"  HostName {ip}", f"  HostKeyAlias {name}"]
            with open(f"{hd}/sshd_config", "w") as f:
                f.write(
                    f"ListenAddress {ip}\nHostKey {hd}/hostkey\nAuthorizedKeysFile {d}/authorized_keys\n"
                    "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\nPidFile none\n"
                    f"SetEnv GPUREAP_BACKEND=sim:{sim}\nMaxStartups 100\nMaxSessions 100\n"
                )
            log = open(f"{hd}/sshd.log", "w")
            server = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--pid", "--fork", "--kill-child",
                 "--mount-proc", "--uts", "sh", "-c",
                 f"hostname {name} && {PRIVATE_DIRS} && exec /usr/sbin/sshd -D -e -f {hd}/sshd_config"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
            self.servers.append(server)
            self.hosts.append((name, ip, sim))
        with open(f"{d}/known_hosts", "w") as f:
            f.write("\n".join(known) + "\n")
        with open(f"{d}/ssh_config", "w") as f:
            f.write("\n".join(config) + "\n")
        for name, ip, _ in self.hosts:
            deadline = time.time() + 10
            while True:
                try:
                    socket.create_connection((ip, 22), timeout=0.2).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise RuntimeError(f"sshd of {name} did not listen")
                    time.sleep(0.02)

    @property
    def config(self):
        return f"{self.dir}/ssh_config"

    def ssh(self, host, script):
        return subprocess.run(
            ["ssh", "-F", self.config, "-o", "BatchMode=yes", host, script],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True,
        ).stdout

    def hold(self, host, title, gpu, nbytes):
        """A CUDA-like holder on `host`: every node open, `nbytes` on `gpu`."""
        sim = dict((n, s) for n, _, s in self.hosts)[host]
        script = (
            f'for n in "$D"/nvidia[0-9]*; do echo none > "$D/claims/$BASHPID.${{n##*/nvidia}}"; done; '
            f'echo {nbytes} > "$D/claims/$BASHPID.{gpu}"; '
            f'for n in "$D"/nvidia[0-9]*; do exec {{fd}}<"$n"; done; exec 9<"$D/nvidiactl"; '
            f"exec -a '{title}' sleep 100000"
        )
        quoted = script.replace("'", "'\\''")
        self.ssh(host, f"D={sim} setsid bash -c '{quoted}' </dev/null >/dev/null 2>&1 &")

    def close(self):
        for server in self.servers:
            with contextlib.suppress(ProcessLookupError):
                server.kill()
            server.wait()
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def keygen(path):
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpureap-lab", "-f", path)


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    lab = Lab(count)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        for name, _, _ in lab.hosts[: max(1, count // 2)]:
            lab.hold(name, "sglang::scheduler_TP0", 0, 30 << 30)
        print(f'export GPUREAP_SSH="ssh -F {lab.config}"', flush=True)
        print(f"# hosts h1..h{count}; half hold a 30 GiB sglang worker on GPU 0. "
              "Ctrl-C or close stdin to tear down.", flush=True)
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    finally:
        lab.close()


if __name__ == "__main__":
    main()
