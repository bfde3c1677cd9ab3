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

Steps sharing an allocation's CPUs need ``srun --overlap`` (otherwise they
wait for each other); a ``salloc`` whose command outlives the job needs
``--kill-command``, or it keeps running after ``stop()``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pwd
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
    directory tells which cluster it belongs to.
    """
    prefix = str(directory) + "/"
    inodes: set[str] = set()
    try:
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[7].startswith(prefix):
                    inodes.add(f"socket:[{fields[6]}]")
    except OSError:
        return set()
    holders: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
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
    _procs: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict, repr=False)

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
        and slurmctld's helper children still left are killed after the daemons.
        Files stay in ``workdir`` for post-mortem reading.
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
        munged = self._procs.pop("munged", None)
        # slurmds and slurmctld first, munged last: they talk to it while shutting down.
        for group in (list(self._procs.values()), [munged] if munged else []):
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


def _write_conf(run: Path, nodes: list[str], cpus: int, ports: list[int]) -> Path:
    """slurm.conf for ``nodes`` on 127.0.0.1: slurmctld on ports[0], node i on ports[i+1]."""
    host = socket.gethostname().split(".")[0]
    user = pwd.getpwuid(os.geteuid()).pw_name
    (run / "plugstack.conf").write_text("")
    lines = [
        "ClusterName=apgastest",
        # slurmctld only runs where SlurmctldHost names this host.
        f"SlurmctldHost={host}(127.0.0.1)",
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
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
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
    for name, port in zip(nodes, ports[1:]):
        lines.append(f"NodeName={name} NodeHostname={name} NodeAddr=127.0.0.1 Port={port}"
                     f" CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES"
                 " MaxTime=INFINITE State=UP")
    conf = run / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _check_available() -> dict[str, str]:
    """Paths of the binaries; SlurmUnavailable when one is missing."""
    paths = {name: _find(name) for name in DAEMONS + CLIENTS}
    missing = sorted(name for name, path in paths.items() if path is None)
    if missing:
        raise SlurmUnavailable(f"Slurm test cluster unavailable: {', '.join(missing)} not found"
                               " (install slurmctld, slurmd, slurm-client and munge:"
                               " .ci/install-services)")
    return {name: path for name, path in paths.items() if path is not None}


def _spawn(cluster: SlurmCluster, name: str, args: list[str]) -> subprocess.Popen:
    """Start one daemon in the foreground; its early stderr goes to ``<name>.out``."""
    with open(cluster.workdir / f"{name}.out", "wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=cluster.env, cwd=cluster.workdir, start_new_session=True,
                                preexec_fn=_die_with_parent)
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


def start_slurm(workdir: Path, nodes: int = 3, cpus: int = 8,
                timeout: float = 30) -> SlurmCluster:
    """Start munged, slurmctld and ``nodes`` slurmds (node1..nodeN, ``cpus`` CPUs each).

    Returns once every node is idle.  Raises SlurmUnavailable when Slurm cannot
    run here and RuntimeError (with the daemon logs) when it does not come up.
    """
    paths = _check_available()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if len(str(workdir)) > MAX_DIR_LENGTH:
        # Unix socket paths are limited to 108 bytes.
        workdir = Path(tempfile.mkdtemp(prefix="slurm-"))
    names = [f"node{i}" for i in range(1, nodes + 1)]
    for sub in ("state", "spool", *(f"spool/{n}" for n in names)):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    conf = _write_conf(workdir, names, cpus, free_ports(nodes + 1))
    env = {**_clean_environ(), "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(nodes=names, conf=str(conf), env=env, workdir=workdir)
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
        _spawn(cluster, "slurmctld", [paths["slurmctld"], "-D", "-c", "-f", str(conf)])
        _wait(cluster, "slurmctld answers",
              lambda: cluster.run("scontrol", "ping", timeout=5).stdout.count("UP") > 0, timeout)
        for name in names:
            _spawn(cluster, f"slurmd-{name}", [paths["slurmd"], "-D", "-N", name, "-f", str(conf)])
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
