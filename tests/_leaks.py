"""Leaks fail the test that made them, as Dask distributed's test fixtures do.

Before each test (after its session and module fixtures, which may keep a Slurm
cluster, an sshd or a browser up) the ``leak_check`` fixture notes what this
test process holds: child processes, place processes started by it (found by
their ``--parent``, also when reparented), threads, file descriptors (listening
sockets among them), the entries of its temporary directory, its signal handlers
and its environment variables (a test that leaves Ctrl-C ignored, or an
``APGAS_`` variable set, changes every later test of its worker). After the test
it waits up to :data:`SETTLE` seconds, for the events it cannot see (a thread
joining, a child being reaped, a socket closed by the garbage collector), for
everything new to be gone; what is still there fails the test, naming it (a
process left is killed; a signal handler or a variable is put back). Each test is checked against what it found, so none is
blamed for another's leftovers.

Each test process (each pytest-xdist worker) has a temporary directory of its
own, sticky and world-writable as ``/tmp`` is, so what one worker leaves there is
not blamed on a test of another (:func:`private_tempdir`).
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

from launcher._proctitle import serve_argv

__all__ = ["SETTLE", "Holdings", "alive", "holdings", "leaks", "lasting", "private_tempdir", "leak_check",
           "place_processes"]

SETTLE = 10.0  # s: a loaded machine may take this long to end what a test stopped
#: entries of the temporary directory that outlive a test by design: the user's
#: socket directory of schedulers (made once, as tmux's), pytest's own base directory
LASTING_TEMP = ("apgas-scheduler-", "pytest-of-")
_PACKAGES = sysconfig.get_paths()["purelib"] + "/"


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    stat = _stat(str(pid))
    return stat is not None and stat[0] not in ("Z", "X")


def _stat(pid: str) -> tuple[str, int] | None:
    """``(state, parent pid)`` of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _processes() -> dict[int, int]:
    """Live processes (zombies count as gone): pid to parent pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) and stat[0] not in ("Z", "X"):
            found[int(entry)] = stat[1]
    return found


def place_processes(parent: int, processes: Iterable[int] | None = None) -> list[int]:
    """Pids of live place processes started by ``parent`` (also once reparented), among
    ``processes`` (default: every live process)."""
    found = []
    for pid in _processes() if processes is None else processes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = serve_argv(f.read())  # titled or not: see launcher._proctitle
        except OSError:
            continue
        if args is not None and "--parent" in args[:-1] and args[args.index("--parent") + 1] == str(parent):
            found.append(pid)
    return found


def _lasting_fd(target: str) -> bool:
    """A descriptor a library keeps for the process's life, whoever opened it first:
    a data file of an installed package (matplotlib's font cache keeps its fonts open)
    or an arena of multiprocessing's shared-memory heap (kept for reuse)."""
    return target.startswith((_PACKAGES, f"/dev/shm/pym-{os.getpid()}-"))


_SESSION_PIDS: set[int] = set()


def lasting(pid: int) -> None:
    """Say that process ``pid``, started during a test, belongs to a session fixture (a
    virtual host's daemon started again after a test crashed the host): not a leak."""
    _SESSION_PIDS.add(pid)


def _lasting_process(pid: int) -> bool:
    """A session fixture's (:func:`lasting`), or multiprocessing's resource tracker:
    started on first use, it ends with the process."""
    return pid in _SESSION_PIDS or "multiprocessing.resource_tracker" in _cmdline(pid)


def _fds() -> dict[int, str]:
    found = {}
    tracker = getattr(resource_tracker._resource_tracker, "_fd", None)  # its pipe, as lasting as it
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:  # the directory's own descriptor, closed by now
            continue
        if not _lasting_fd(target) and int(entry) != tracker:
            found[int(entry)] = target
    return found


def _listening() -> dict[str, str]:
    """Socket inodes in the LISTEN state (TCP over IPv4 and IPv6, Unix) to their address."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":
                port = int(fields[1].rsplit(":", 1)[1], 16)
                found[fields[9]] = f"{table} port {port}"
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[5] == "01" and fields[3] == "00010000":  # connected-less, __SO_ACCEPTCON
                found[fields[6]] = f"unix {fields[7] if len(fields) > 7 else '(unnamed)'}"
    except OSError:
        pass
    return found


@dataclass(frozen=True)
class Holdings:
    """What this test process holds at one moment."""

    children: frozenset[int]
    threads: frozenset[threading.Thread]
    fds: dict[int, str]
    temp: frozenset[str]
    handlers: dict[signal.Signals, object]
    environ: dict[str, str]


def _handlers() -> dict[signal.Signals, object]:
    """Each catchable signal's handler (a Python function, SIG_DFL or SIG_IGN); not
    SIGALRM's, which pytest-timeout sets and clears around each test."""
    return {sig: signal.getsignal(sig) for sig in signal.valid_signals()
            if isinstance(sig, signal.Signals)
            and sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGALRM)}


def holdings(temp: Path) -> Holdings:
    processes = _processes()
    me = os.getpid()
    children = {pid for pid, parent in processes.items() if parent == me and not _lasting_process(pid)}
    children.update(place_processes(me, processes))
    return Holdings(frozenset(children), frozenset(t for t in threading.enumerate() if t.is_alive()),
                    _fds(), frozenset(e.name for e in os.scandir(temp)
                                      if not e.name.startswith(LASTING_TEMP)),
                    _handlers(), {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"})


def leaks(before: Holdings, after: Holdings) -> list[str]:
    """What ``after`` holds that ``before`` did not, one line each."""
    said = [f"process {pid}: {_cmdline(pid)}" for pid in sorted(after.children - before.children)]
    said += [f"thread {t.name!r} ({'daemon' if t.daemon else 'not daemon'})"
             for t in sorted(after.threads - before.threads, key=lambda t: t.name)]
    new_fds = {fd: target for fd, target in after.fds.items() if before.fds.get(fd) != target}
    if new_fds:
        listening = _listening()
        for fd, target in sorted(new_fds.items()):
            inode = target[len("socket:["):-1] if target.startswith("socket:[") else ""
            where = f", listening on {listening[inode]}" if inode in listening else ""
            said.append(f"file descriptor {fd} -> {target}{where}")
    said += [f"temporary entry {name}" for name in sorted(after.temp - before.temp)]
    said += [f"the handler of {sig.name}: {after.handlers[sig]!r}, was {before.handlers[sig]!r}"
             for sig in before.handlers if after.handlers.get(sig) != before.handlers[sig]]
    said += [f"environment variable {name}={after.environ.get(name)!r}, was {before.environ.get(name)!r}"
             for name in sorted(before.environ.keys() | after.environ.keys())
             if before.environ.get(name) != after.environ.get(name)]
    return said


def _undo(before: Holdings, after: Holdings) -> None:
    """Kill the processes the test left and put back the signal handlers and the
    environment it changed, so that they cost the next tests nothing. What else it
    left stays (closing a descriptor under its owner would break that owner later);
    each test is checked against what it found, so none is blamed twice."""
    for pid in after.children - before.children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for sig, handler in before.handlers.items():
        if after.handlers.get(sig) != handler and handler is not None:
            signal.signal(sig, handler)  # type: ignore[arg-type]
    for name in after.environ.keys() - before.environ.keys():
        os.environ.pop(name, None)
    os.environ.update(before.environ)


def private_tempdir(config: pytest.Config) -> Path:
    """Give this test process a temporary directory of its own (``TMPDIR``, which its
    children inherit), sticky and writable by all as ``/tmp`` is: tests act as other
    users there. Removed, with whatever is left in it, by :func:`remove_tempdir`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "tests")
    path = Path(tempfile.mkdtemp(prefix=f"apgas-{worker}-", dir=tempfile.gettempdir()))
    path.chmod(0o1777)
    config._apgas_tmp = (path, os.environ.get("TMPDIR"))  # type: ignore[attr-defined]
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)
    return path


def remove_tempdir(config: pytest.Config) -> None:
    path, old = getattr(config, "_apgas_tmp", (None, None))
    if path is None:
        return
    tempfile.tempdir = None
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def leak_check(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a process, thread, descriptor, listening port or
    temporary entry behind (see the module's docstring)."""
    temp = Path(tempfile.gettempdir())
    before = holdings(temp)
    yield
    after = holdings(temp)
    found = leaks(before, after)
    deadline = time.monotonic() + SETTLE
    while found and time.monotonic() < deadline:  # rare: only a test that leaves something
        gc.collect()  # sockets and files that only a cycle still holds
        time.sleep(0.05)
        after = holdings(temp)
        found = leaks(before, after)
    if found:
        _undo(before, after)
        pytest.fail("left behind by the test:\n  " + "\n  ".join(found), pytrace=False)
