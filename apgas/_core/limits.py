"""The operating system's limits a run of many places meets, checked before it starts.

Place 0 holds, per place, a link (a DEALER: its socket's mailbox and a TCP
connection), the heartbeat monitor of that link (a pair of sockets, two more
mailboxes), the connection that place made to place 0's ROUTER, and, for a
place of this machine, its stdin and stderr pipes, its pidfd and both ends of
the same-host path's Unix streams (:mod:`apgas._core.local_links`): about
:data:`FDS_PER_PLACE` descriptors and :data:`SOCKETS_PER_PLACE` ZeroMQ
sockets. A place of this machine also runs threads (its workers, its
immediate pool, the network, heartbeat and parent threads, the pool's
standby, the batch flusher, the same-host door and backlog writer, ZeroMQ's
I/O and reaper threads) and takes
memory.

:func:`check_start` compares what ``n`` more places need with the limits
(``RLIMIT_NOFILE``, the ZeroMQ context's ``MAX_SOCKETS``, ``RLIMIT_NPROC``,
``kernel.pid_max`` and ``kernel.threads-max``, ``MemAvailable``) and raises
one :class:`~apgas.errors.LimitError` naming the limit, its value and how
to raise it, before any place is started. Every place raises its soft
descriptor limit to the hard one, as Go's runtime does, and sizes its ZeroMQ
context from it (:func:`max_sockets`): libzmq's default of 1,023 sockets
ends a run near 340 places.
"""

from __future__ import annotations

import logging
import os
import resource

import zmq

from ..errors import LimitError

__all__ = ["FDS_PER_PLACE", "SOCKETS_PER_PLACE", "THREADS_BESIDE_WORKERS", "PLACE_MEMORY",
           "max_sockets", "zmq_context", "check_start", "open_fds",
           "raise_soft_nofile"]

log = logging.getLogger("apgas.limits")

FDS_PER_PLACE = 10          # place 0's descriptors per place (measured: 7.1 with fork, local,
# before the same-host path added both ends of a Unix stream each)
SOCKETS_PER_PLACE = 3       # place 0's ZeroMQ sockets per place: the link and its monitor pair
THREADS_BESIDE_WORKERS = 11  # main, network, heartbeat, parent, ZeroMQ I/O and reaper,
# the pool's standby, the batch flusher, a spare, the same-host door and backlog writer
PLACE_MEMORY = 12 << 20     # bytes a forked place takes of its own (PSS, measured 13-15 MiB)
RESERVE_FDS = 64            # for place 0's own files, sockets of its program, the scheduler's
ZMQ_DEFAULT_SOCKETS = 1023  # libzmq's ZMQ_MAX_SOCKETS
ZMQ_SOCKET_LIMIT = 65535    # libzmq's ZMQ_SOCKET_LIMIT: the largest MAX_SOCKETS it takes


def _nofile() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def max_sockets(nofile: int | None = None) -> int:
    """The ZeroMQ sockets a context of this process may open: as many as it may open
    descriptors (every socket holds one, its mailbox), at least libzmq's default
    1,023, at most its limit of 65,535 (``RLIM_INFINITY`` too)."""
    soft = _nofile()[0] if nofile is None else nofile
    if soft == resource.RLIM_INFINITY or soft < 0:
        return ZMQ_SOCKET_LIMIT
    return max(ZMQ_DEFAULT_SOCKETS, min(soft, ZMQ_SOCKET_LIMIT))


def zmq_context() -> zmq.Context[zmq.Socket[bytes]]:
    """A ZeroMQ context for a place: one I/O thread (place 0's thousand links move
    little data each), :func:`max_sockets` sockets."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=1)
    ctx.max_sockets = max_sockets(raise_soft_nofile())
    return ctx


def open_fds() -> int:
    """The descriptors this process has open (0 where /proc is not there)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _tasks_running() -> int:
    """Threads of every process of the machine (the 4th field of /proc/loadavg)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return 0


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def raise_soft_nofile() -> int:
    """Raise the soft descriptor limit to the hard one (at most 2^20), as Go's runtime
    does at its start: a thousand places need thousands of descriptors at place 0, and
    the places inherit it. The soft limit now."""
    soft, hard = _nofile()
    target = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    log.debug("raised the soft descriptor limit (RLIMIT_NOFILE) from %d to %d", soft, target)
    return target


def check_start(new: int, total: int, local: int, threads: int) -> None:
    """Raise :class:`~apgas.errors.LimitError` unless place 0 can start ``new`` more
    places, ``total`` in all afterwards, ``local`` of them on this machine (forked or
    spawned children) running ``threads`` worker and immediate threads each."""
    if new <= 0:
        return
    have = open_fds()
    fds_needed = have + new * FDS_PER_PLACE + RESERVE_FDS
    soft, hard = _nofile()
    if soft != resource.RLIM_INFINITY and fds_needed > soft:
        most = max(0, (soft - have - RESERVE_FDS) // FDS_PER_PLACE)
        raise LimitError(
            "RLIMIT_NOFILE", soft,
            f"starting {new} more place(s) ({total} in all) needs about {fds_needed:,} open "
            f"descriptors at place 0 ({FDS_PER_PLACE} per place), above its limit of {soft:,} "
            f"(RLIMIT_NOFILE, hard limit {'unlimited' if hard == resource.RLIM_INFINITY else hard}); "
            f"about {most} more place(s) fit: raise it with 'ulimit -n {fds_needed}' in the shell "
            "that starts the run (or in /etc/security/limits.conf, LimitNOFILE= under systemd), "
            "or start fewer places")
    sockets_limit = max_sockets()  # as place 0's context was made with (the soft limit is kept)
    # its ROUTER, stop socket, and the ZAP handler's socket and pipe pair (zmtp_auth)
    sockets_needed = 5 + (total - 1) * SOCKETS_PER_PLACE
    if sockets_needed > sockets_limit:
        raise LimitError(
            "ZMQ_MAX_SOCKETS", sockets_limit,
            f"starting {new} more place(s) ({total} in all) needs {sockets_needed:,} ZeroMQ "
            f"sockets at place 0 ({SOCKETS_PER_PLACE} per place), above its context's limit of "
            f"{sockets_limit:,} (ZMQ_MAX_SOCKETS, set from RLIMIT_NOFILE up to libzmq's "
            f"{ZMQ_SOCKET_LIMIT:,}); raise 'ulimit -n', or start fewer places")
    if local <= 0:
        return
    tasks = local * (threads + THREADS_BESIDE_WORKERS)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if nproc != resource.RLIM_INFINITY and os.geteuid() != 0 and \
            _tasks_running() + tasks > nproc:  # root is not held to RLIMIT_NPROC
        raise LimitError(
            "RLIMIT_NPROC", nproc,
            f"starting {local} place(s) on this machine needs about {tasks:,} threads "
            f"({threads + THREADS_BESIDE_WORKERS} per place with APGAS_THREADS and "
            f"APGAS_IMMEDIATE_THREADS as set) beside the {_tasks_running():,} running, above "
            f"the limit of {nproc:,} processes and threads per user (RLIMIT_NPROC); raise it with "
            f"'ulimit -u', or lower APGAS_THREADS, or use more hosts")
    for name, path in (("kernel.threads-max", "/proc/sys/kernel/threads-max"),
                       ("kernel.pid_max", "/proc/sys/kernel/pid_max")):
        value = _read_int(path)
        if value is not None and _tasks_running() + tasks > value:
            raise LimitError(
                name, value,
                f"starting {local} place(s) on this machine needs about {tasks:,} threads "
                f"({threads + THREADS_BESIDE_WORKERS} per place) beside the {_tasks_running():,} "
                f"running, above the kernel's {name} of {value:,}; raise it with "
                f"'sysctl -w {name}=...' (root), or lower APGAS_THREADS, or use more hosts")
    available = _mem_available()
    memory = local * PLACE_MEMORY
    if available is not None and memory > available:
        raise LimitError(
            "MemAvailable", available,
            f"starting {local} place(s) on this machine needs about {memory / 2**30:.1f} GiB "
            f"({PLACE_MEMORY >> 20} MiB per forked place, before the program's own data), above "
            f"the {available / 2**30:.1f} GiB of memory available (MemAvailable in /proc/meminfo); "
            "use more hosts or fewer places")
