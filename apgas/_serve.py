"""Entry point of a place other than 0: ``python -m apgas._serve``.

Reads one JSON line of bootstrap data from stdin, joins place 0, serves
tasks until told to stop, and exits by itself when stdin reaches end of file
(its parent is gone).

With ``--fork-server FD`` the process is the local launcher's template instead
(:mod:`launcher._forkserver`): it imports what a place needs, once, and forks a
child per request that runs :func:`main` as above.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

from launcher._forktemplate import serve_forks
from launcher._proctitle import place_title, set_title, template_title
from launcher.mpi import load_mpi, stand_down, start_watchdog

from ._core import serialization as ser
from ._core.config import Config, is_wildcard, parse_preload
from ._core.logs import setup_logging
from ._core.runtime import JOIN, Runtime, install

log = logging.getLogger("apgas.serve")

EXIT_PARENT_LOST = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apgas._serve")
    parser.add_argument("--parent", type=int, required=True)
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--place", type=int)
    role.add_argument("--fork-server", type=int, metavar="FD")
    parser.add_argument("--preload", default="", help="the fork server's modules to import too")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.fork_server is not None:
        set_title(template_title(args.parent, argv))
        return fork_server(args.fork_server, args.preload)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is place 0's to handle
    boot = json.loads(sys.stdin.buffer.readline() or b"null")
    if not isinstance(boot, dict):
        print("apgas place: no bootstrap data on stdin", file=sys.stderr)
        return 2
    set_title(place_title(boot["place"], boot["host"], argv))
    code = serve(boot, watch_stdin=True)
    os._exit(code)  # worker threads may be deep in a task: do not wait for them


def fork_server(fd: int, preload: str = "") -> int:
    """The template: import now what every place would import at its start, then fork places.

    No thread and no ZeroMQ context exist here before a fork (numpy's OpenBLAS
    stops its own threads in a fork handler); ``gc.freeze`` keeps the imported
    objects out of the children's collections, so their pages stay shared.
    ``preload`` (``APGAS_PRELOAD``) names modules to import too, each with an
    optional function to call: ``glb.apps.uts:warm_up`` imports the UTS bag and
    loads its numba kernels, which every new place would otherwise do itself.
    """
    import gc

    import cloudpickle  # noqa: F401  (the places' pickler)
    import zmq  # noqa: F401

    from ._core import heartbeat as _heartbeat  # noqa: F401

    try:
        import numpy.random  # noqa: F401  (tasks and the serializer's buffers; reseeded per place)
    except ImportError:
        pass
    if not _preload(preload):
        return 2
    gc.freeze()
    return serve_forks(fd, main)


def _preload(names: str) -> bool:
    """Import each ``module[:function]`` of ``names`` (comma-separated) and call the
    function; one that fails is skipped with a warning. False if that left a
    thread running: a fork copies no thread but all locks, so the template must
    not fork (the launching place then warns and starts places fresh)."""
    import importlib

    for entry in parse_preload("--preload", names):  # checked by place 0's configuration
        name, _, function = entry.partition(":")
        try:
            module = importlib.import_module(name)
            if function:
                getattr(module, function)()
        except Exception as e:  # a module of the program, say, that is not on this path
            print(f"apgas fork server: APGAS_PRELOAD: {entry!r} failed: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        print(f"apgas fork server: APGAS_PRELOAD {names!r} started threads ({', '.join(others)}), "
              "which a fork cannot copy: no place is forked", file=sys.stderr, flush=True)
    return not others


def serve(boot: dict[str, Any], watch_stdin: bool) -> int:
    """Join place 0 with the bootstrap data, serve until told to stop; the exit code.

    With ``watch_stdin`` the place also stops when its stdin reaches end of
    file; under mpiexec, which owns the ranks, it does not.
    """
    sys.path[:] = boot["sys_path"] + [p for p in sys.path if p not in boot["sys_path"]]
    config = dataclasses.replace(Config(), **boot["config"])
    place_id, host = boot["place"], boot["host"]
    setup_logging(place_id, config.log_level)
    config = dataclasses.replace(config, interface=local_interface(config.interface,
                                                                   boot["parent_endpoint"]))
    rt = Runtime(place_id, host, bytes.fromhex(boot["secret"]), config)
    install(rt)
    rt.transport.start(rt.pool.lead)  # leader/followers: see apgas._core.pool
    rt.transport.connect(0, boot["parent_endpoint"])
    rt.transport.send(0, JOIN, 0, 0, ser.dumps((rt.transport.endpoint, rt.pid, host)))
    if watch_stdin:
        threading.Thread(target=_watch_parent, args=(rt,), name="apgas-parent", daemon=True).start()
    rt.stopped.wait()
    log.info("stopping: %s", rt.stop_reason)
    code = EXIT_PARENT_LOST if rt.stop_reason.startswith("lost") else 0
    if rt.stop_reason.startswith("left"):
        rt.transport.close(linger_ms=5000)  # finish reports and replies still queued must leave
    logging.shutdown()
    sys.stderr.flush()
    return code


def local_interface(interface: str, parent_endpoint: str) -> str:
    """The interface setting as it applies on this host.

    ``*`` and addresses of this host stay. Any other address is place 0's
    (set for its host, e.g. ``APGAS_INTERFACE=10.1.0.1``): here it means the
    address this host reaches place 0 from, which the kernel's routing picks
    (a UDP socket's connect sends nothing)."""
    if is_wildcard(interface):
        return interface
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((interface, 0))
        return interface
    except OSError:
        pass
    peer = parent_endpoint.removeprefix("tcp://").rpartition(":")[0]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, 9))
            mine: str = probe.getsockname()[0]  # (address, port) for AF_INET
    except OSError as e:
        log.warning("interface %s is not this host's, and the route to place 0 at %s is not "
                    "known (%s); binding it anyway", interface, peer, e)
        return interface
    log.info("interface %s is not this host's: binding %s, from which place 0 at %s is reached",
             interface, mine, peer)
    return mine


def _watch_parent(rt: Runtime) -> None:
    stream = sys.stdin.buffer
    while stream.read(4096):
        pass
    rt.stop_reason = "lost place 0: its end of stdin closed"
    rt.stopped.set()


def serve_rank() -> NoReturn:
    """An mpiexec rank other than 0: serve as a place until the job ends, then exit."""
    MPI = load_mpi()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # mpiexec passes Ctrl-C to all; rank 0 stops us
    comm = MPI.COMM_WORLD
    comm.gather(MPI.Get_processor_name(), root=0)
    boot = comm.bcast(None, root=0)
    boot.update(place=comm.Get_rank(), host=MPI.Get_processor_name())
    set_title(place_title(boot["place"], boot["host"], None))
    watchdog = start_watchdog(boot)  # ends this rank if place 0 is lost and it cannot end
    code = serve(boot, watch_stdin=False)
    if code == 0:
        stand_down(watchdog)  # an orderly end: finalize in peace
    MPI.Finalize()
    _exit_with_pmi_finalize(code)


def _exit_with_pmi_finalize(code: int) -> NoReturn:
    """End a rank through the C library's ``exit``, not ``os._exit``.

    MPICH tells its process manager that a rank ended well (PMI ``finalize``)
    from a C ``atexit`` handler, not from ``MPI_Finalize``. ``os._exit`` skips
    that handler, so hydra's proxy sees the rank's PMI socket close without a
    finalize, takes it for a crash and SIGKILLs every rank of the node that has
    not sent its own finalize yet: the job then ends with exit code 9 whenever
    another rank was a moment slower. C ``exit`` runs the handler but, like
    ``os._exit``, does not wait for the runtime's Python threads.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).exit(code)
    os._exit(code)  # not reached; keeps the NoReturn promise for the type checker


if __name__ == "__main__":
    sys.exit(main())
