"""A real Slurm cluster on this one machine, for the tests of the srun launcher.

``start_slurm`` starts a private ``munged`` (throwaway key, own socket), a
``slurmctld`` and one ``slurmd`` per node, all listening on 127.0.0.1 on ports
found free at start time, with every file (slurm.conf, state, spool, logs, pid
files) under one work directory.  Nothing in /etc or /run is used or changed,
so it neither needs nor disturbs a system Slurm or munge.

How several nodes fit on one host: Debian's slurmd (tried with 12's 22.05.8)
is built with ``--enable-multiple-slurmd``: ``slurmd -N nodeX`` picks the node
and ``%n`` in SlurmdSpoolDir/SlurmdPidFile/SlurmdLogFile is expanded, so every
node is one slurmd process with its own NodeName, ``NodeAddr=127.0.0.1`` and
its own Port.  No network namespaces are needed.  All tasks therefore run on
this host and ``hostname`` prints the real host name; ``$SLURMD_NODENAME``
tells the nodes apart.

The daemons run as the user running the tests (SlurmUser/SlurmdUser), so no
root is needed: as root the jobs may run as any user, otherwise only as that
user.  ``SlurmUnavailable`` (tests skip) is raised when a binary is missing;
``.ci/install-services`` installs the Debian packages.

Daemons get ``PR_SET_PDEATHSIG`` so that they also die when the test process is
killed before ``stop()`` runs.  When the work directory's path is too long for
unix socket paths, a short one is made under the temporary directory instead
(``SlurmCluster.workdir`` says which).

Accounting: when ``slurmdbd`` and MariaDB's ``mariadbd``/``mariadb-install-db``
are installed (Debian's slurmdbd and mariadb-server), a private MariaDB (data
directory under the work directory, unix socket only, run as the current user)
and a ``slurmdbd`` on it are started first, and slurmctld records jobs there
(``AccountingStorageType=accounting_storage/slurmdbd``, nothing enforced).  Only
then can a job be resized more than once: with ``accounting_storage/none`` the
first ``scontrol update jobid=.. NumNodes=..`` works and every later one fails
with "Job update not available right now, the DB index is being set".
``SlurmCluster.accounting`` says which storage runs, ``resizable`` whether jobs
can be resized repeatedly and ``not_resizable`` why not (for a skip reason).
Without those binaries the cluster starts as before, with ``accounting/none``.
``SchedulerParameters=permit_job_expansion`` lets a job grow (``--dependency=expand:``).

Nodes on other addresses (the virtual cluster of network namespaces,
``tests/vcluster.py``): ``start_slurm(..., names=[...], addresses=[...],
controller_address=..., wrap=...)`` names the nodes, gives each its own
``NodeAddr``, lets slurmctld be reached at ``controller_address``
(``SlurmctldHost=<this host>(<address>)``; it listens on every address anyway)
and starts each slurmd through ``wrap(name, argv)`` (e.g. ``nsenter --net=``; not
``ip netns exec``, whose fresh /sys lacks the /sys/fs/cgroup slurmd needs).
munged, slurmdbd and MariaDB are reached through unix sockets and slurmdbd on
127.0.0.1 by slurmctld only, so they stay where the test runs.

Steps sharing an allocation's CPUs need ``srun --overlap`` (otherwise they
wait for each other); a ``salloc`` whose command outlives the job needs
``--kill-command``, or it keeps running after ``stop()``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from orders import free_ports

__all__ = ["SlurmCluster", "SlurmUnavailable", "slurm_cluster", "start_slurm"]

PARTITION = "debug"
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
CLIENTS = ("sinfo", "scontrol", "scancel", "squeue", "srun", "salloc")
# Accounting with slurmdbd on a private MariaDB: optional (accounting/none without).
# Each entry is one program, by any of its names (MariaDB keeps MySQL's as links).
ACCOUNTING = {"slurmdbd": ("slurmdbd",), "mariadbd": ("mariadbd", "mysqld"),
              "mariadb-install-db": ("mariadb-install-db", "mysql_install_db")}
DATABASE = "slurm_acct_db"
# Unix socket paths (munge socket, slurmstepd sockets in the spool) must stay short.
MAX_DIR_LENGTH = 70

_libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols include libc's prctl
_PR_SET_PDEATHSIG = 1


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here (binaries missing): tests skip."""


def _die_with_parent() -> None:
    """Child side of Popen: get SIGTERM when the process that started us dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _descendants(pids: set[int]) -> set[int]:
    """All live descendants of ``pids`` (slurmctld forks slurmscriptd, for example)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_holders(directory: Path) -> set[int]:
    """Pids holding a unix socket bound under ``directory``: the slurmstepds of our slurmds.

    slurmstepd daemonizes away from slurmd, so only its socket in the spool
    directory tells which cluster it belongs to.  /proc/net/unix lists only the
    sockets of the reader's network namespace, so that of every namespace a
    process runs in is read (slurmds may run in other namespaces).
    """
    prefix = str(directory) + "/"
    pids = [e for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
    tables = {"/proc/net/unix"}
    seen: set[str] = set()
    for pid in pids:
        try:
            netns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if netns not in seen:
            seen.add(netns)
            tables.add(f"/proc/{pid}/net/unix")
    inodes: set[str] = set()
    for table in sorted(tables):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if len(fields) >= 8 and fields[7].startswith(prefix):
                        inodes.add(f"socket:[{fields[6]}]")
        except (OSError, StopIteration):
            continue
    if not inodes:
        return set()
    holders: set[int] = set()
    for entry in pids:
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                holders.add(int(entry))
        except OSError:
            continue
    return holders


def _find(name: str) -> str | None:
    """Path of a binary, looking in the sbin directories too (often not in a user's PATH)."""
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN])
    return shutil.which(name, path=path)


def _clean_environ() -> dict[str, str]:
    """os.environ without Slurm job variables, so an outer Slurm job cannot leak in."""
    prefixes = ("SLURM_", "SALLOC_", "SRUN_", "SBATCH_", "SQUEUE_", "SINFO_", "SCONTROL_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"==> {path}: (missing)"
    return f"==> {path} <==\n" + "\n".join(text)


@dataclasses.dataclass
class SlurmCluster:
    """A running cluster: pass ``env`` to subprocesses so salloc/srun/scontrol use it."""

    nodes: list[str]
    conf: str
    env: dict[str, str]
    workdir: Path
    partition: str = PARTITION
    # "slurmdbd" (private MariaDB + slurmdbd) or "none" (accounting_storage/none).
    accounting: str = "none"
    # Why accounting is "none", or "" when slurmdbd runs.
    not_resizable: str = ""
    _procs: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def resizable(self) -> bool:
        """True when jobs can be resized repeatedly (needs slurmdbd, see module doc)."""
        return self.accounting == "slurmdbd"

    def logs(self, lines: int = 25) -> str:
        """Tail of every daemon log, for error messages."""
        names = sorted(p.name for p in self.workdir.glob("*.log"))
        names += sorted(p.name for p in self.workdir.glob("*.out"))
        return "\n".join(_tail(self.workdir / n, lines) for n in names)

    def run(self, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(args, env=self.env, cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout)

    def node_states(self) -> dict[str, str]:
        """Node name -> state as sinfo prints it (``idle``, ``alloc``, ``down*`` ...)."""
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if " " in line)

    def stop(self) -> None:
        """Cancel all jobs, then stop every process this cluster started (by pid).

        Jobs are cancelled first so that slurmstepd kills the tasks; slurmstepds
        and slurmctld's helper children still left are killed after the daemons,
        the database (mariadbd) last.  Files stay in ``workdir`` for post-mortem
        reading.
        """
        if not self._procs:
            return
        ctld = self._procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run("scancel", f"--partition={self.partition}", timeout=5)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    jobs = self.run("squeue", "--noheader", "--format=%i", timeout=5)
                    if jobs.returncode == 0 and not jobs.stdout.strip() \
                            and not _socket_holders(self.workdir / "spool"):
                        break
                    time.sleep(0.2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        daemons = {p.pid for p in self._procs.values()}
        helpers = _descendants(daemons) | _socket_holders(self.workdir / "spool")
        # slurmds and slurmctld first (slurmctld reports to slurmdbd while shutting
        # down), then slurmdbd, munged (they all talk to it) and the database last.
        last = ("slurmdbd", "munged", "mariadbd")
        groups = [[p for n, p in self._procs.items() if n not in last]]
        groups += [[self._procs[n]] for n in last if n in self._procs]
        for group in groups:
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            for proc in group:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()
        deadline = time.monotonic() + 5
        for pid in helpers - daemons:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        while time.monotonic() < deadline and any(_alive(p) for p in helpers - daemons):
            time.sleep(0.05)
        for pid in helpers - daemons:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _write_conf(run: Path, nodes: list[str], cpus: int, ports: list[int],
                dbd_port: int | None = None, addresses: list[str] | None = None,
                controller_address: str = "127.0.0.1") -> Path:
    """slurm.conf for ``nodes`` on 127.0.0.1: slurmctld on ports[0], node i on ports[i+1].

    With ``dbd_port`` jobs are recorded by the slurmdbd listening there.  Node i
    has address ``addresses[i]`` when given; slurmctld is reached at ``controller_address``.
    """
    addresses = addresses or ["127.0.0.1"] * len(nodes)
    host = socket.gethostname().split(".")[0]
    user = pwd.getpwuid(os.geteuid()).pw_name
    (run / "plugstack.conf").write_text("")
    lines = [
        "ClusterName=apgastest",
        # slurmctld only runs where SlurmctldHost names this host.
        f"SlurmctldHost={host}({controller_address})",
        f"SlurmctldPort={ports[0]}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={run / 'munge.sock'}",
        f"StateSaveLocation={run / 'state'}",
        f"SlurmdSpoolDir={run / 'spool'}/%n",
        f"SlurmctldPidFile={run / 'slurmctld.pid'}",
        f"SlurmdPidFile={run}/slurmd-%n.pid",
        f"SlurmctldLogFile={run / 'slurmctld.log'}",
        f"SlurmdLogFile={run}/slurmd-%n.log",
        f"PlugStackConfig={run / 'plugstack.conf'}",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        *(["AccountingStorageType=accounting_storage/none"] if dbd_port is None else [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={dbd_port}",
            # The munge socket for talking to slurmdbd (AuthInfo does not cover it).
            f"AccountingStoragePass={run / 'munge.sock'}",
        ]),
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        # Jobs may grow: salloc --dependency=expand:<job>, then hand its nodes over.
        "SchedulerParameters=permit_job_expansion",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # Declare `cpus` CPUs per node whatever this machine has.
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmctldTimeout=10",
        "SlurmdTimeout=10",
        "MessageTimeout=5",
        "TCPTimeout=2",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=5",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, port, address in zip(nodes, ports[1:], addresses, strict=True):  # ports[0]: slurmctld
        lines.append(f"NodeName={name} NodeHostname={name} NodeAddr={address} Port={port}"
                     f" CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES"
                 " MaxTime=INFINITE State=UP")
    conf = run / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _write_dbd_conf(run: Path, port: int, password: str) -> Path:
    """slurmdbd.conf beside slurm.conf (slurmdbd looks for it there): mode 0600, as it demands."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={run / 'munge.sock'}",
        # slurmdbd runs only where DbdHost names this host; "localhost" always does.
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={port}",
        f"SlurmUser={user}",
        f"PidFile={run / 'slurmdbd.pid'}",
        f"LogFile={run / 'slurmdbd.log'}",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        # "localhost": MariaDB's client library connects to the unix socket that
        # $MYSQL_UNIX_PORT names (slurmdbd has no setting for a socket path).
        "StorageHost=localhost",
        "StorageUser=slurm",
        f"StoragePass={password}",
        f"StorageLoc={DATABASE}",
    ]
    conf = run / "slurmdbd.conf"
    conf.touch(mode=0o600)
    conf.chmod(0o600)
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _find_accounting() -> tuple[dict[str, str], str]:
    """Paths of slurmdbd and MariaDB's programs, or ({}, why not)."""
    paths: dict[str, str] = {}
    for name, candidates in ACCOUNTING.items():
        path = next((p for p in map(_find, candidates) if p), None)
        if path is None:
            return {}, (f"no slurmdbd accounting: {name} not found (install slurmdbd and"
                        " mariadb-server: .ci/install-services); with accounting_storage/none"
                        " a job can be resized only once")
        paths[name] = path
    return paths, ""


def _check_available() -> dict[str, str]:
    """Paths of the binaries; SlurmUnavailable when one is missing."""
    paths = {name: _find(name) for name in DAEMONS + CLIENTS}
    missing = sorted(name for name, path in paths.items() if path is None)
    if missing:
        raise SlurmUnavailable(f"Slurm test cluster unavailable: {', '.join(missing)} not found"
                               " (install slurmctld, slurmd, slurm-client and munge:"
                               " .ci/install-services)")
    return {name: path for name, path in paths.items() if path is not None}


def _spawn(cluster: SlurmCluster, name: str, args: list[str],
           env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start one daemon in the foreground; its early stderr goes to ``<name>.out``."""
    with open(cluster.workdir / f"{name}.out", "wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=env or cluster.env, cwd=cluster.workdir,
                                start_new_session=True, preexec_fn=_die_with_parent)
    cluster._procs[name] = proc
    return proc


def _wait(cluster: SlurmCluster, what: str, ready: Callable[[], bool], timeout: float) -> None:
    """Poll ``ready()`` until true; RuntimeError with the logs on timeout or a dead daemon."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except (OSError, subprocess.TimeoutExpired):
            pass
        dead = [n for n, p in cluster._procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            reason = f"{', '.join(dead)} exited" if dead else f"not after {timeout:.0f} s"
            raise RuntimeError(f"Slurm test cluster: {what}: {reason}\n{cluster.logs()}")
        time.sleep(0.1)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _start_accounting(cluster: SlurmCluster, paths: dict[str, str], port: int,
                      timeout: float) -> None:
    """A private MariaDB (unix socket only) with slurmdbd's database and user, then slurmdbd."""
    run = cluster.workdir
    data, tmp, sock = run / "db", run / "db-tmp", run / "mariadb.sock"
    tmp.mkdir(exist_ok=True)
    password = secrets.token_hex(12)
    # Run by mariadbd at start, before it accepts connections.
    init = run / "db-init.sql"
    init.write_text(f"CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
                    f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}';\n"
                    f"GRANT ALL ON {DATABASE}.* TO 'slurm'@'localhost';\n")
    init.chmod(0o600)
    # mariadbd refuses to run as root unless told to.
    as_user = ["--user=root"] if os.geteuid() == 0 else []
    # Small, unsynced InnoDB: throwaway data, quick start.
    innodb = ["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M",
              "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
              "--innodb-flush-method=nosync", "--innodb-autoextend-increment=4"]
    with open(run / "mariadb-install-db.out", "wb") as out:
        made = subprocess.run(
            [paths["mariadb-install-db"], "--no-defaults", f"--datadir={data}",
             "--auth-root-authentication-method=normal", "--skip-test-db",
             "--skip-name-resolve", *as_user, *innodb],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=cluster.env, cwd=run,
            timeout=timeout, check=False)
    if made.returncode != 0:
        raise RuntimeError(f"Slurm test cluster: mariadb-install-db failed\n{cluster.logs()}")
    log = run / "mariadb.log"
    _spawn(cluster, "mariadbd", [
        paths["mariadbd"], "--no-defaults", f"--datadir={data}", f"--socket={sock}",
        f"--pid-file={run / 'mariadb.pid'}", f"--log-error={log}", f"--tmpdir={tmp}",
        f"--init-file={init}", "--skip-networking", "--skip-log-bin", "--skip-name-resolve",
        *as_user, *innodb])
    _wait(cluster, "mariadbd ready",
          lambda: sock.exists() and "ready for connections" in log.read_text(errors="replace"),
          timeout)
    _write_dbd_conf(run, port, password)
    _spawn(cluster, "slurmdbd", [paths["slurmdbd"], "-D"],
           env={**cluster.env, "MYSQL_UNIX_PORT": str(sock)})
    _wait(cluster, "slurmdbd listens", lambda: _listening(port), timeout)
    cluster.accounting = "slurmdbd"


def start_slurm(workdir: Path, nodes: int = 3, cpus: int = 8, timeout: float = 30,
                accounting: bool | None = None, *, names: list[str] | None = None,
                addresses: list[str] | None = None, controller_address: str = "127.0.0.1",
                wrap: Callable[[str, list[str]], list[str]] | None = None) -> SlurmCluster:
    """Start munged, slurmctld and ``nodes`` slurmds (node1..nodeN, ``cpus`` CPUs each).

    ``accounting``: None (default) also starts MariaDB and slurmdbd when they are
    installed (``SlurmCluster.resizable``), True requires them (SlurmUnavailable
    without), False keeps ``accounting_storage/none``.

    ``names``: the node names (then ``nodes`` is ignored); ``addresses``: each
    node's NodeAddr (default 127.0.0.1 for all); ``controller_address``: where
    slurmds reach slurmctld; ``wrap(name, argv)``: the command that starts the
    slurmd of node ``name`` (it must exec slurmd in place, not fork it).

    Returns once every node is idle.  Raises SlurmUnavailable when Slurm cannot
    run here and RuntimeError (with the daemon logs) when it does not come up.
    """
    paths = _check_available()
    if accounting is False:
        dbd_paths, why_not = {}, ("started with accounting=False (accounting_storage/none):"
                                  " a job can be resized only once")
    else:
        dbd_paths, why_not = _find_accounting()
    if accounting and not dbd_paths:
        raise SlurmUnavailable(why_not)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if len(str(workdir)) > MAX_DIR_LENGTH:
        # Unix socket paths are limited to 108 bytes.
        workdir = Path(tempfile.mkdtemp(prefix="slurm-"))
    names = list(names) if names is not None else [f"node{i}" for i in range(1, nodes + 1)]
    nodes = len(names)
    if addresses is not None and len(addresses) != nodes:
        raise ValueError(f"{len(addresses)} addresses for {nodes} nodes")
    for sub in ("state", "spool", *(f"spool/{n}" for n in names)):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    ports = free_ports(nodes + 2)
    dbd_port = ports.pop() if dbd_paths else None
    conf = _write_conf(workdir, names, cpus, ports[:nodes + 1], dbd_port,
                       list(addresses) if addresses is not None else None, controller_address)
    env = {**_clean_environ(), "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(nodes=names, conf=str(conf), env=env, workdir=workdir,
                           not_resizable=why_not)
    try:
        key = workdir / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        sock = workdir / "munge.sock"
        _spawn(cluster, "munged", [
            paths["munged"], "--foreground", "--force", f"--socket={sock}",
            f"--key-file={key}", f"--pid-file={workdir / 'munged.pid'}",
            f"--seed-file={workdir / 'munged.seed'}"])  # --foreground: it logs to munged.out
        _wait(cluster, "munged socket", sock.exists, 10)
        if dbd_port is not None:
            _start_accounting(cluster, dbd_paths, dbd_port, timeout)
        _spawn(cluster, "slurmctld", [paths["slurmctld"], "-D", "-c", "-f", str(conf)])
        _wait(cluster, "slurmctld answers",
              lambda: cluster.run("scontrol", "ping", timeout=5).stdout.count("UP") > 0, timeout)
        for name in names:
            argv = [paths["slurmd"], "-D", "-N", name, "-f", str(conf)]
            _spawn(cluster, f"slurmd-{name}", wrap(name, argv) if wrap else argv)
        _wait(cluster, "all nodes idle",
              lambda: all(cluster.node_states().get(n) == "idle" for n in names), timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One Slurm cluster (node1..node3, 8 CPUs each) for the whole session; skips without Slurm."""
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
