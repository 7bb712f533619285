"""Two "hosts" on this machine for bench/peers/ (needs root): network
namespaces on a bridge, as bench/hosts.sh makes them."""

import os
import shutil
import subprocess
import sys


def die(msg, code=1):
    print(f"netns: {msg}", file=sys.stderr)
    sys.exit(code)


class Hosts:
    """n (2) "hosts" on this machine, as bench/hosts.sh makes them: network
    namespaces on a bridge (10.215.0.1, .2, ...; nothing added to this
    machine's own namespace); what runs in one gets its own IPC, PID and UTS
    namespaces too, so UCX takes the other for another machine (TCP)."""

    A0, A1 = "10.215.0.1", "10.215.0.2"

    def __init__(self, n=2):
        p = f"dppr-{os.getpid()}"
        self.sw = f"{p}-sw"
        self.hosts = [f"{p}-h{i}" for i in range(n)]
        self.addrs = [f"10.215.0.{i + 1}" for i in range(n)]
        self.h0, self.h1 = self.hosts[0], self.hosts[1]

    def ip(self, *args):
        subprocess.run(["ip", *args], check=True)

    def up(self):
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
            die("two hosts need root, ip and unshare (network namespaces)", 2)
        for n in [self.sw] + self.hosts:
            self.ip("netns", "add", n)
        self.ip("-n", self.sw, "link", "set", "lo", "up")
        self.ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.sw, "link", "set", "br0", "up")
        for i, (h, a) in enumerate(zip(self.hosts, self.addrs)):
            self.ip("-n", self.sw, "link", "add", f"p{i}", "type", "veth", "peer", "name",
                    "eth0", "netns", h)
            self.ip("-n", self.sw, "link", "set", f"p{i}", "master", "br0", "up")
            self.ip("-n", h, "link", "set", "lo", "up")
            self.ip("-n", h, "addr", "add", f"{a}/24", "dev", "eth0")
            self.ip("-n", h, "link", "set", "eth0", "up")

    def wrap(self, h):
        """The command prefix that runs a process in host h as another machine."""
        return ["ip", "netns", "exec", h, "unshare", "--ipc", "--pid", "--uts", "--fork",
                "--kill-child"]

    def down(self):
        for h in reversed(self.hosts):
            pids = subprocess.run(["ip", "netns", "pids", h], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
        for n in list(reversed(self.hosts)) + [self.sw]:
            subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)
