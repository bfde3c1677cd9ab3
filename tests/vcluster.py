"""A virtual cluster of network namespaces on this one machine (needs root).

``start_vcluster(workdir, hosts=4)`` makes hosts ``vh1``..``vhN``: one network
namespace each (``apgas-vc<k>-<owner pid>-h<i>``) with loopback and one
``eth0`` at ``198.18.<k>.<i>/24``, the benchmarking range (RFC 2544); nothing
else is ever used, IPv6 link-local addresses are not even generated
(``addrgenmode none``).  ``k`` tells concurrent clusters apart (1..511; 256..511
use 198.19.x).

Network: every ``eth0`` is one end of a veth pair whose other end is a port of
a bridge that lives in a namespace of its own (the "switch",
``apgas-vc<k>-<pid>-sw``), not in the root namespace: the root namespace's
netfilter (Docker's FORWARD policy with br_netfilter, for one) never sees the
bridged traffic, and the root namespace gets no bridge.  The root namespace,
where pytest runs, is the login node ``vlogin``: one more veth pair, whose
root end ``apgas-vc<k>`` has ``198.18.<k>.254/24`` (its only change to the root
namespace: that interface and its connected route).  So the test process
reaches every host directly, as place 0 on a login node would.

Names: inside every host, ``/etc/hosts`` (``/etc/netns/<ns>/hosts``) lists
localhost, ``vlogin`` (with this machine's real host name as an alias, so what
a process of the root namespace calls itself resolves to the login address)
and ``vh1``..``vhN``.  ``exec``/``run``/``command`` start a command on a host
with ``nsenter --net`` and a new mount namespace where that file is mounted
over /etc/hosts (what ``ip netns exec`` does, which also works by hand, minus
its fresh /sys that lacks the /sys/fs/cgroup slurmd needs), and a new UTS
namespace whose host name is the host's name: ``hostname``,
``socket.gethostname()`` and ``getfqdn()`` say ``vh2`` on vh2, and so do the
processes of its sshd and slurmd (a place that advertises its host name is
reachable under it).  The root namespace's /etc/hosts is never touched: there
``resolve(name)`` gives the address, the ssh client config maps every name to
its address (``ssh -F <config> vh2`` works from anywhere), Slurm uses
``NodeAddr``, and ``exec("vlogin", argv)`` runs a command in the root network
namespace with the cluster's hosts file mounted over /etc/hosts and host name
``vlogin``: run place 0 of an APGAS program that way, since the places
advertise names (``vh2``) that only the hosts file knows.

Services: an sshd per host on ``<address>:22`` (``tests/_sshd.py``; shared
throwaway keys; ``ClientAliveInterval 1``/``ClientAliveCountMax 3``: a session
whose client vanished ends ~8 s later, measured with OpenSSH 9.2;
``LoginGraceTime 10`` for one that vanished while logging in) and a Slurm
cluster (``tests/_slurm.py``) whose nodes are the hosts: each slurmd runs in
its namespace at its address, slurmctld, munged, slurmdbd and MariaDB run in
the root namespace, slurmctld reached at the login address.

Cleanup: ``stop()`` (the fixture calls it) ends every daemon, kills whatever
still runs in the namespaces, deletes the namespaces, links and
``/etc/netns/<ns>`` directories.  Names carry the owner's pid: each start first
removes what runs of dead owners left (``cleanup()``; also ``python
tests/vcluster.py down``).  Daemons get PR_SET_PDEATHSIG, so they die with the
test process even when it is killed.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script: the test helpers and apgas must be importable
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from _leaks import lasting
from _slurm import (
    SlurmCluster,
    SlurmUnavailable,
    _alive,
    _check_available,
    _find_accounting,
    _spawn,
    start_slurm,
)
from _sshd import SshServer, SshUnavailable, client_config, make_keys, start_sshd
from _sshd import _tools as _ssh_tools

__all__ = ["LOGIN", "VirtualCluster", "VirtualClusterUnavailable", "check_available", "cleanup",
           "leftovers", "start_vcluster", "vcluster"]

PREFIX = "apgas-vc"
LOGIN = "vlogin"
SSH_PORT = 22
CLIENT_ALIVE = (1, 3)  # sshd ends a session ~8 s after its client vanished (measured)
LOGIN_GRACE = 10  # and drops a connection still logging in after 10 s
MAX_INDEX = 511  # 198.18.0.0/15 holds 512 /24 blocks
NETNS_RUN = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
_NAME = re.compile(r"^apgas-vc(\d+)-(\d+)-(sw|h\d+)$")
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
# Run in a new mount and UTS namespace: the hosts file $1 over /etc/hosts, host name $0,
# then the command.
_SCRIPT = ('mount --bind "$1" /etc/hosts && echo "$0" > /proc/sys/kernel/hostname'
           ' && shift && exec "$@"')
# Whether /run/netns and /etc/netns existed before this process made its first cluster
# (they are removed again, when empty, only if they did not).
_PREEXISTING: dict[Path, bool] = {}


class VirtualClusterUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``/``unshare``, no permission)."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", os.defpath), *_SBIN]))


def _tools() -> tuple[str, str, str]:
    """Paths of ``ip``, ``nsenter`` and ``unshare``; VirtualClusterUnavailable says what is missing."""
    if os.geteuid() != 0:
        raise VirtualClusterUnavailable("virtual cluster needs root (network namespaces)")
    found = {name: _which(name) for name in ("ip", "nsenter", "unshare")}
    if missing := [name for name, path in found.items() if not path]:
        raise VirtualClusterUnavailable(f"virtual cluster needs {', '.join(missing)} (packages"
                                        " iproute2, util-linux): not found")
    return found["ip"], found["nsenter"], found["unshare"]  # type: ignore[return-value]


def check_available(ssh: bool = True, slurm: bool = True, accounting: bool | None = None) -> None:
    """Raise what ``start_vcluster`` with these options would raise for a missing program
    or privilege (VirtualClusterUnavailable: not root, no ``ip``/``nsenter``/``unshare``;
    SshUnavailable: no sshd/ssh/ssh-keygen; SlurmUnavailable: no Slurm or munge, or no
    slurmdbd/MariaDB with ``accounting=True``), naming it, before anything is made."""
    _tools()
    if ssh:
        _ssh_tools()
    if slurm:
        _check_available()
        if accounting:
            paths, why_not = _find_accounting()
            if not paths:
                raise SlurmUnavailable(why_not)


def _ip(*args: str, ns: str | None = None, batch: list[str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip [-n ns] args`` (or ``ip -batch -`` with the lines of ``batch``)."""
    ip = _tools()[0]
    argv = [ip, *(("-n", ns) if ns else ()), *(("-batch", "-") if batch is not None else args)]
    done = subprocess.run(argv, input="".join(f"{line}\n" for line in batch or ()),
                          capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        what = " ".join(argv) + ("".join(f"\n  {line}" for line in batch) if batch else "")
        raise RuntimeError(f"{what}\nfailed ({done.returncode}): {done.stderr.strip()}")
    return done


def _block(k: int) -> str:
    """The first three octets of cluster ``k``'s /24 in 198.18.0.0/15."""
    return f"198.{18 + k // 256}.{k % 256}"


def _started(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch, ~1 s precision), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _owner_alive(pid: int, since: float | None) -> bool:
    """True if ``pid`` runs and is the process that made the run whose files date from
    ``since`` (a process started later only reuses the pid)."""
    if not _alive(pid):
        return False
    started = _started(pid)
    return since is None or started is None or started <= since + 2


def _netns_pids(ns: str) -> list[int]:
    """Pids of the processes in network namespace ``ns``."""
    done = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _kill_all(pids: list[int], grace: float) -> list[int]:
    """SIGTERM ``pids`` (SIGKILL at once if ``grace`` is 0), SIGKILL those left after
    ``grace`` s; return those still alive 5 s later."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGTERM and grace <= 0:
            continue
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.02)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            break
    return pids


def _runs() -> dict[tuple[int, int], set[str]]:
    """(k, owner pid) -> namespace names, for every run's namespaces and /etc/netns dirs."""
    runs: dict[tuple[int, int], set[str]] = {}
    for directory in (NETNS_RUN, NETNS_ETC):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if m := _NAME.match(name):
                runs.setdefault((int(m.group(1)), int(m.group(2))), set()).add(name)
    return runs


def _remove(k: int, owner: int, names: set[str], grace: float = 0.0) -> list[str]:
    """Remove what run (k, owner) made: kill its hosts' processes, delete the login link,
    the namespaces and their /etc/netns dirs.  Returns the problems met (empty: all gone)."""
    problems = []
    switch = f"{PREFIX}{k}-{owner}-sw"
    present = set(os.listdir(NETNS_RUN)) if NETNS_RUN.is_dir() else set()
    hosts = sorted(n for n in names | present if n.startswith(f"{PREFIX}{k}-{owner}-h") and n in present)
    pids = [p for ns in hosts for p in _netns_pids(ns)]
    if left := _kill_all(pids, grace):
        problems.append(f"processes survive SIGKILL: {left}")
    link = f"{PREFIX}{k}"
    shown = _ip("-o", "-d", "link", "show", "dev", link, check=False)
    if shown.returncode == 0 and f" link-netns {switch} " in shown.stdout:
        _ip("link", "del", "dev", link, check=False)
    gone = [ns for ns in [*hosts, switch] if ns in present]
    if gone:
        done = _ip("-force", batch=[f"netns del {ns}" for ns in gone], check=False)
        if done.returncode != 0:
            problems.append(done.stderr.strip())
    for ns in names | {switch, *hosts}:
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    return problems


def leftovers(owner: int | None = None) -> dict[str, list[str]]:
    """What runs (of ``owner``, or all) have left: namespaces, /etc/netns dirs, root links."""
    found: dict[str, list[str]] = {"namespaces": [], "etc": [], "links": []}
    for key, directory in (("namespaces", NETNS_RUN), ("etc", NETNS_ETC)):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found[key] = sorted(n for n in names if (m := _NAME.match(n))
                            and (owner is None or int(m.group(2)) == owner))
    if owner is None:
        out = _ip("-o", "link", "show", check=False).stdout
        found["links"] = sorted({m.group(1) for m in re.finditer(rf"^\d+: ({PREFIX}\d+)[@:]", out, re.MULTILINE)})
    return found


def cleanup(everything: bool = False, directories: bool = False) -> list[str]:
    """Remove what runs whose owner process is gone left behind (all runs with
    ``everything``, even live ones: only for ``vcluster.py down --all``).  With
    ``directories`` also /run/netns and /etc/netns when they are empty and no run is
    left (``vcluster.py down``).  Returns the runs removed, as ``apgas-vc<k>-<pid>``."""
    _tools()
    removed = []
    for (k, owner), names in sorted(_runs().items()):
        mtimes = []
        for ns in names:
            try:
                mtimes.append((NETNS_ETC / ns).stat().st_mtime)
            except OSError:
                pass
        if everything or (owner != os.getpid() and not _owner_alive(owner, min(mtimes, default=None))):
            _remove(k, owner, names)
            removed.append(f"{PREFIX}{k}-{owner}")
    _tidy(directories)
    return removed


def _tidy(force: bool = False) -> None:
    """Remove /etc/netns and /run/netns if this process made them (or ``force``), they
    are empty and no run is left (best effort)."""
    if _runs():
        return
    for directory in (NETNS_ETC, NETNS_RUN):
        if _PREEXISTING.get(directory, True) and not force:
            continue
        try:
            if os.listdir(directory):
                continue
            if directory == NETNS_RUN:  # ip makes it a mount of itself (os.path.ismount misses that)
                with open("/proc/self/mountinfo") as f:
                    mounted = any(line.split()[4] == str(directory) for line in f)
                if mounted:
                    subprocess.run(["umount", str(directory)], capture_output=True, timeout=10)
            directory.rmdir()
        except OSError:
            pass


def _used_blocks() -> set[str]:
    """The 198.18.0.0/15 /24 blocks the root namespace already routes or has addresses in."""
    bench = ipaddress.ip_network("198.18.0.0/15")
    used: set[str] = set()
    words = _ip("-4", "-o", "addr", "show", check=False).stdout.split()
    words += [line.split()[1] if line.split()[0] in ("local", "broadcast", "unicast", "anycast",
                                                      "multicast", "blackhole", "unreachable",
                                                      "prohibit", "throw") and len(line.split()) > 1
              else line.split()[0]
              for line in _ip("-4", "-o", "route", "show", "table", "all", check=False
                              ).stdout.splitlines() if line.split()]
    for word in words:
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if net.version == 4 and net.prefixlen >= 15 and net.overlaps(bench):
            for k in range(MAX_INDEX + 1):
                if ipaddress.ip_network(f"{_block(k)}.0/24").overlaps(net):
                    used.add(_block(k))
    return used


@dataclasses.dataclass
class VirtualCluster:
    """A running virtual cluster; ``stop()`` removes it.  Hosts are named ``vh1``..``vhN``;
    ``vlogin`` is the root namespace (the login node)."""

    index: int  # k: addresses are 198.18.<k>.x (198.19.<k-256>.x from 256)
    owner: int  # pid of the process that made it (in every name it made)
    workdir: Path
    hosts: list[str]  # ["vh1", ..., "vhN"]
    addresses: dict[str, str]  # every host and LOGIN -> its address
    namespaces: dict[str, str]  # host -> network namespace name
    switch: str  # the namespace holding the bridge
    login_link: str  # the root namespace's interface (198.18.<k>.254)
    hosts_file: Path  # the /etc/hosts of every host
    ssh_servers: dict[str, SshServer] = dataclasses.field(default_factory=dict)
    ssh_config: str | None = None  # ssh client config: every host by name (``ssh -F``)
    ssh_command: list[str] | None = None  # e.g. ["/usr/bin/ssh", "-F", ssh_config]
    slurm: SlurmCluster | None = None
    _stopped: bool = dataclasses.field(default=False, repr=False)

    @property
    def login(self) -> str:
        return LOGIN

    @property
    def login_address(self) -> str:
        return self.addresses[LOGIN]

    @property
    def network(self) -> str:
        return f"{_block(self.index)}.0/24"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients (SLURM_CONF) if Slurm runs, else os.environ's copy."""
        return dict(self.slurm.env) if self.slurm else dict(os.environ)

    def resolve(self, name: str) -> str:
        """The address of ``name`` as the hosts' /etc/hosts says (an address maps to itself).
        This machine's real host name resolves to the login address there. KeyError if unknown."""
        if name in self.addresses:
            return self.addresses[name]
        if name == socket.gethostname():
            return self.login_address
        if name in self.addresses.values():
            return name
        raise KeyError(f"{name!r} is not a host of virtual cluster {self.network}")

    def host_of(self, name: str) -> str:
        """The host name for a host name or address."""
        address = self.resolve(name)
        return next(h for h, a in self.addresses.items() if a == address)

    def namespace(self, host: str) -> str:
        """The network namespace of ``host`` (ValueError for ``vlogin``: the root namespace)."""
        host = self.host_of(host)
        if host == LOGIN:
            raise ValueError("vlogin is the root network namespace")
        return self.namespaces[host]

    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run on ``host`` (exec'd in place: the pid stays the command's).

        On a host: in its network namespace, on ``vlogin`` in the root one; either way in
        a new mount namespace (propagation slave, as ``ip netns exec`` makes) where the
        cluster's hosts file is mounted over /etc/hosts, and a new UTS namespace whose
        host name is ``host``.  Unlike ``ip netns exec`` this does not mount a new /sys
        (that one lacks /sys/fs/cgroup, without which slurmd does not start).
        """
        _, nsenter, unshare = _tools()
        host = self.host_of(host)
        enter = [] if host == LOGIN else [nsenter, f"--net={NETNS_RUN / self.namespaces[host]}", "--"]
        hosts_file = self.hosts_file if host == LOGIN else NETNS_ETC / self.namespaces[host] / "hosts"
        return [*enter, unshare, "--mount", "--propagation", "slave", "--uts", "--",
                "/bin/sh", "-c", _SCRIPT, host, str(hosts_file), *argv]

    def exec(self, host: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (see ``command``); keyword arguments go to Popen."""
        return subprocess.Popen(self.command(host, argv), **popen_kwargs)

    def run(self, host: str, argv: list[str], timeout: float = 30,
            **kwargs) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` to its end; output captured as text unless told otherwise."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        if "stdout" not in kwargs and "stderr" not in kwargs:
            kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(host, argv), timeout=timeout, **kwargs)

    def ssh(self, host: str, *command: str) -> list[str]:
        """The argv of ``ssh <host> <command>`` through the cluster's client config."""
        if not self.ssh_command:
            raise RuntimeError("this virtual cluster runs no sshd (ssh=False)")
        return [*self.ssh_command, host, *command]

    def _port(self, host: str) -> str:
        host = self.host_of(host)
        return "login" if host == LOGIN else f"h{self.hosts.index(host) + 1}"

    def link_down(self, host: str) -> None:
        """Cut ``host`` off (its switch port goes down): nothing reaches it and it reaches
        nothing, its address and processes stay, like a partition or a pulled cable."""
        _ip("link", "set", "dev", self._port(host), "down", ns=self.switch)

    def link_up(self, host: str) -> None:
        """Reconnect ``host`` (undo ``link_down``)."""
        _ip("link", "set", "dev", self._port(host), "up", ns=self.switch)

    def link_is_up(self, host: str) -> bool:
        out = _ip("-o", "link", "show", "dev", self._port(host), ns=self.switch).stdout
        return bool(re.search(r"<[^>]*\bUP\b", out))

    def pids(self, host: str) -> list[int]:
        """Pids of the processes running on ``host`` (in its namespace)."""
        return _netns_pids(self.namespace(host))

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process on ``host`` (its sshd and slurmd too), like a crash; returns
        their pids. The host stays reachable (``link_down`` to cut it off)."""
        pids = self.pids(host)
        _kill_all(pids, 0)
        self._reap()
        return pids

    def revive_host(self, host: str, timeout: float = 30) -> None:
        """Bring ``host`` back after ``kill_host``/``link_down``: reconnect it, start its
        sshd and slurmd again if they are gone, and return once ssh logs in and Slurm
        has the node back (idle, mixed or allocated)."""
        host = self.host_of(host)
        self.namespace(host)
        self.link_up(host)
        old = self.ssh_servers.get(host)
        if old is not None and old.process.poll() is not None:
            old.stop(timeout=1)
            self.ssh_servers[host] = start_sshd(
                old.workdir, [host], address=self.addresses[host], port=SSH_PORT,
                wrap=lambda argv: self.command(host, argv), keys=self.workdir / "ssh",
                client_alive=CLIENT_ALIVE, login_grace=LOGIN_GRACE, die_with_parent=True,
                wait=False)
            self.ssh_servers[host].wait_ready(timeout)
            lasting(self.ssh_servers[host].process.pid)  # the cluster's, not the test's
        if self.slurm is None:
            return
        name = f"slurmd-{host}"
        proc = self.slurm._procs.get(name)
        if proc is None or proc.poll() is None:
            return
        starts = self._slurmd_starts(host)
        lasting(_spawn(self.slurm, name, list(proc.args)).pid)
        deadline = time.monotonic() + timeout
        while not (self._slurmd_starts(host) > starts
                   and self.slurm.node_states().get(host, "") in ("idle", "mix", "alloc")):
            if self.slurm._procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slurmd of {host} did not come back\n{self.slurm.logs()}")
            time.sleep(0.1)

    def _slurmd_starts(self, host: str) -> int:
        """How often the slurmd of ``host`` has started (its log says so each time)."""
        try:
            log = (self.slurm.workdir / f"slurmd-{host}.log").read_text(errors="replace")
        except (OSError, AttributeError):
            return 0
        return log.count("slurmd started on")

    def _reap(self) -> None:
        """Collect the daemons of ours that died (no zombies)."""
        for server in self.ssh_servers.values():
            server.process.poll()
        if self.slurm is not None:
            for proc in self.slurm._procs.values():
                proc.poll()

    def describe(self) -> str:
        """How to use the cluster, for people."""
        head = (f"virtual cluster {self.network} (namespaces {PREFIX}{self.index}-{self.owner}-*,"
                f" bridge in {self.switch})")
        lines = [head]
        for host in [LOGIN, *self.hosts]:
            where = "root namespace" if host == LOGIN else self.namespaces[host]
            lines.append(f"  {host:8} {self.addresses[host]:15} {where}")
        lines.append(f"  hosts file: {self.hosts_file} (the root namespace's /etc/hosts does not"
                     " know these names: use the addresses here)")
        lines.append(f"  a shell on vh1:  {shlex.join(self.command(self.hosts[0], ['bash']))}")
        lines.append(f"    (or: ip netns exec {self.namespaces[self.hosts[0]]} bash, with this"
                     " machine's host name)")
        if self.ssh_command:
            lines.append(f"  ssh:   {' '.join(self.ssh_command)} vh1 hostname")
        if self.slurm:
            lines.append(f"  Slurm: export SLURM_CONF={self.slurm.conf}; "
                         f"srun -N{len(self.hosts)} hostname")
        return "\n".join(lines)

    def stop(self) -> None:
        """Stop every daemon, kill what still runs on the hosts, delete the namespaces,
        links and /etc/netns dirs.  Idempotent; raises RuntimeError if something stays."""
        if self._stopped:
            return
        self._stopped = True
        problems: list[str] = []
        for host in self.hosts:  # jobs on cut-off hosts could not be cleaned up
            try:
                self.link_up(host)
            except RuntimeError:
                pass
        if self.slurm is not None:
            try:
                self.slurm.stop()
            except Exception as exc:  # noqa: BLE001 -- the network must go in any case
                problems.append(f"Slurm stop: {exc!r}")
            if not self.slurm.workdir.is_relative_to(self.workdir):
                # start_slurm's short directory for a too long workdir: not ours to keep
                shutil.rmtree(self.slurm.workdir, ignore_errors=True)
        for server in self.ssh_servers.values():
            try:
                server.stop(timeout=2)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"sshd stop: {exc!r}")
        names = {*self.namespaces.values(), self.switch}
        problems += _remove(self.index, self.owner, names, grace=2.0)
        _tidy()
        if problems:
            raise RuntimeError("virtual cluster teardown: " + "; ".join(problems))


def _hosts_file(addresses: dict[str, str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    real = socket.gethostname()
    for host, address in addresses.items():
        aliases = [host]
        if host == LOGIN and real not in addresses and real != "localhost":
            aliases.append(real)  # what the root namespace's processes call themselves
        lines.append(f"{address}\t{' '.join(aliases)}")
    return "\n".join(lines) + "\n"


def _claim(owner: int) -> tuple[int, str, str]:
    """Claim a free k: make the switch namespace and the root link ``apgas-vc<k>`` (its
    name is the lock: the kernel refuses a second one).  Returns (k, switch, link)."""
    used = _used_blocks()
    links = _ip("-o", "link", "show", check=False).stdout
    for k in range(1, MAX_INDEX + 1):
        link = f"{PREFIX}{k}"
        if _block(k) in used or re.search(rf"^\d+: {link}[@:]", links, re.MULTILINE):
            continue
        switch = f"{PREFIX}{k}-{owner}-sw"
        made = _ip("netns", "add", switch, check=False)
        if made.returncode != 0:
            raise VirtualClusterUnavailable(f"cannot create a network namespace: {made.stderr.strip()}")
        taken = _ip("link", "add", "name", link, "type", "veth", "peer", "name", "login",
                    "netns", switch, check=False)
        if taken.returncode == 0:
            return k, switch, link
        _ip("netns", "del", switch, check=False)
        if "File exists" not in taken.stderr:
            raise VirtualClusterUnavailable(f"cannot create a veth pair: {taken.stderr.strip()}")
    raise RuntimeError("no free 198.18.0.0/15 block for a virtual cluster")


def _make_network(vc: VirtualCluster) -> None:
    """Namespaces, veths, bridge, addresses, hosts files."""
    _ip(batch=[f"netns add {vc.namespaces[h]}" for h in vc.hosts] + [
        f"link add name h{i} netns {vc.switch} type veth peer name eth0 netns {vc.namespaces[h]}"
        for i, h in enumerate(vc.hosts, 1)])
    ports = ["login"] + [f"h{i}" for i in range(1, len(vc.hosts) + 1)]
    _ip(ns=vc.switch, batch=[
        "link add name br0 type bridge forward_delay 0 stp_state 0",
        "link set dev br0 addrgenmode none",
        *(f"link set dev {p} addrgenmode none" for p in ports),
        *(f"link set dev {p} master br0" for p in ports),
        "link set dev br0 up",
        *(f"link set dev {p} up" for p in ports)])
    for host in vc.hosts:
        _ip(ns=vc.namespaces[host], batch=[
            "link set dev lo up", "link set dev eth0 addrgenmode none",
            f"addr add {vc.addresses[host]}/24 dev eth0", "link set dev eth0 up"])
    _ip(batch=[f"link set dev {vc.login_link} addrgenmode none",
               f"addr add {vc.login_address}/24 dev {vc.login_link}",
               f"link set dev {vc.login_link} up"])
    text = _hosts_file(vc.addresses)
    vc.hosts_file.write_text(text)
    for host in vc.hosts:
        for _attempt in range(5):  # another run's _tidy may remove /etc/netns in between
            try:
                directory = NETNS_ETC / vc.namespaces[host]
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "hosts").write_text(text)
                break
            except FileNotFoundError:
                time.sleep(0.01)


def start_vcluster(workdir: Path, hosts: int = 4, slurm: bool = True, ssh: bool = True, *,
                   cpus: int = 8, accounting: bool | None = None,
                   timeout: float = 30) -> VirtualCluster:
    """Start a virtual cluster of ``hosts`` namespaces (see the module doc) with an sshd on
    each (``ssh``) and a Slurm whose nodes they are (``slurm``: ``cpus`` CPUs a node,
    ``accounting`` as in ``start_slurm``).  Files go under ``workdir``.

    Raises VirtualClusterUnavailable (no root, no ``ip``, no permission), SshUnavailable or
    SlurmUnavailable (programs missing: ``check_available``, before anything is made) and
    RuntimeError (something did not come up); in every case what was made is removed again.  The caller must call ``stop()``.
    Start it from a thread that lives as long as the cluster: the daemons get SIGTERM when
    the starting thread ends (PR_SET_PDEATHSIG).
    """
    if not 1 <= hosts <= 253:
        raise ValueError("hosts must be 1..253")
    check_available(ssh, slurm, accounting)  # a missing program: nothing is made
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    for directory in (NETNS_RUN, NETNS_ETC):
        _PREEXISTING.setdefault(directory, directory.exists())
    cleanup()
    owner = os.getpid()
    k, switch, link = _claim(owner)
    names = [f"vh{i}" for i in range(1, hosts + 1)]
    addresses = {LOGIN: f"{_block(k)}.254", **{h: f"{_block(k)}.{i}" for i, h in enumerate(names, 1)}}
    vc = VirtualCluster(index=k, owner=owner, workdir=workdir, hosts=names, addresses=addresses,
                        namespaces={h: f"{PREFIX}{k}-{owner}-h{i}" for i, h in enumerate(names, 1)},
                        switch=switch, login_link=link, hosts_file=workdir / "hosts")
    try:
        _make_network(vc)
        waiters: list[threading.Thread] = []
        errors: list[BaseException] = []
        if ssh:
            keys = make_keys(workdir / "ssh")  # revive_host finds them there
            for host in names:  # started here (PDEATHSIG: this thread), waited for in threads
                vc.ssh_servers[host] = start_sshd(
                    workdir / "ssh" / host, [host], address=addresses[host], port=SSH_PORT,
                    wrap=lambda argv, h=host: vc.command(h, argv), keys=keys,
                    client_alive=CLIENT_ALIVE, login_grace=LOGIN_GRACE, die_with_parent=True,
                    wait=False)
            config = workdir / "ssh" / "ssh_config"
            config.write_text(client_config(keys, {h: (addresses[h], SSH_PORT) for h in names}))
            vc.ssh_config = str(config)
            vc.ssh_command = [*vc.ssh_servers[names[0]].command[:-1], str(config)]

            def wait(server: SshServer) -> None:
                try:
                    server.wait_ready(timeout)
                except BaseException as exc:  # noqa: BLE001 -- reported below
                    errors.append(exc)

            waiters = [threading.Thread(target=wait, args=(s,), daemon=True)
                       for s in vc.ssh_servers.values()]
            for thread in waiters:
                thread.start()
        if slurm:
            vc.slurm = start_slurm(
                workdir / "slurm", cpus=cpus, timeout=timeout, accounting=accounting, names=names,
                addresses=[addresses[h] for h in names], controller_address=vc.login_address,
                wrap=lambda name, argv: vc.command(name, argv))
        for thread in waiters:
            thread.join(timeout)
        if errors:
            raise errors[0]
    except BaseException:
        try:
            vc.stop()
        except RuntimeError:
            pass
        raise
    return vc


@pytest.fixture(scope="session")
def vcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualCluster]:
    """A virtual cluster (vh1..vh4, sshd and Slurm on each) for the whole session; skips
    where namespaces, sshd or Slurm are not available."""
    try:
        vc = start_vcluster(tmp_path_factory.mktemp("vcluster"))
    except (VirtualClusterUnavailable, SshUnavailable, SlurmUnavailable) as exc:
        pytest.skip(str(exc))
    try:
        yield vc
    finally:
        vc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A virtual cluster of network namespaces.")
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start one, wait for Ctrl-C, remove it")
    up.add_argument("--hosts", type=int, default=4)
    up.add_argument("--no-slurm", action="store_true")
    up.add_argument("--no-ssh", action="store_true")
    up.add_argument("--workdir", help="for its files (default: a new temporary directory, removed)")
    down = sub.add_parser("down", help="remove what clusters of dead processes left")
    down.add_argument("--all", action="store_true", help="also clusters whose owner still runs")
    sub.add_parser("list", help="list the clusters' namespaces")
    args = parser.parse_args(argv)
    try:
        if args.action == "list":
            for (k, owner), names in sorted(_runs().items()):
                state = "running" if _alive(owner) else "left over"
                print(f"{PREFIX}{k}-{owner} ({state}): {' '.join(sorted(names))}")
            return 0
        if args.action == "down":
            removed = cleanup(everything=args.all, directories=True)
            print("removed: " + (" ".join(removed) if removed else "nothing"))
            return 0
        workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="apgas-vc-"))
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda *_: stop.set())
        began = time.monotonic()
        vc = start_vcluster(workdir, hosts=args.hosts, slurm=not args.no_slurm, ssh=not args.no_ssh)
        try:
            print(vc.describe())
            print(f"up in {time.monotonic() - began:.1f} s; Ctrl-C removes it", flush=True)
            while not stop.wait(1):
                pass
        finally:
            began = time.monotonic()
            vc.stop()
            if not args.workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            print(f"removed in {time.monotonic() - began:.1f} s")
        return 0
    except (VirtualClusterUnavailable, SshUnavailable, SlurmUnavailable) as exc:
        print(f"vcluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
