"""Run a job under the ElasticJobScheduler (EJS) of malleable APGAS for Java.

EJS starts a job script on the job's first node with its own variables
(``NODE_FILE``, ``LAUNCHER``, ``SCHEDULER_IP``, ``SCHEDULER_PORT``, ``WORKERS``,
...) and sends orders to that node at ``SCHEDULER_PORT``.
:func:`ejs_environment` maps them onto ours, and ``python -m apgas ejs-env``
prints them for the job script (``docs/schedulers.md`` has a whole one)::

    exports=$(python -m apgas ejs-env) || exit 1
    eval "$exports"

What the job then does differently (only the lines EJS knows, plain lines,
no job id, requests without answers) is in ``docs/protocol.md``; so are EJS's
limits (:data:`SHRINK_BUDGET` for a shrink's reply, 60 s between resizes, one
node per request).
"""

from __future__ import annotations

import errno
import shlex
import socket
from collections.abc import Mapping

from launcher import launcher_names, read_hostfile

from .errors import ConfigError
from .protocol import ascii_int, check_host

__all__ = ["ejs_environment", "shell_exports", "launcher_for", "started_by_ejs",
           "startup_line", "initialization_line", "SHRINK_BUDGET", "JAVA_LAUNCHERS"]

#: EJS's variables a job needs; without them this is not a job EJS started.
REQUIRED = ("NODE_FILE", "SCHEDULER_IP", "SCHEDULER_PORT")

#: Seconds EJS waits for each line of a shrink's reply (``setSoTimeout`` of
#: ``Constants.TIMEOUT_TIME_SOCKET_MILLIS``, 20000 ms). A later reply is lost:
#: EJS logs "Error by shrink", takes the job out of malleability and keeps
#: counting the released nodes as the job's.
SHRINK_BUDGET = 20.0

#: EJS's ``LAUNCHER`` names a launcher class of the Java runtime (its default is
#: ``apgas.launcher.SshLauncher``); ours of the same kind.
JAVA_LAUNCHERS = {"apgas.launcher.SshLauncher": "ssh", "apgas.launcher.SrunLauncher": "srun"}


def launcher_for(value: str) -> str:
    """Our launcher for EJS's ``LAUNCHER``: a Java class of :data:`JAVA_LAUNCHERS`,
    or one of our launcher names (for an EJS started with ours as its inside
    launcher). ConfigError names the value and what is known."""
    if value in JAVA_LAUNCHERS:
        return JAVA_LAUNCHERS[value]

    names = launcher_names()
    if value in names:
        return value
    known = ", ".join(f"{java} ({ours})" for java, ours in JAVA_LAUNCHERS.items())
    raise ConfigError(f"LAUNCHER {value!r} is no launcher apgas knows: expected {known} "
                      f"or one of ours, {names}")


def ejs_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``APGAS_*`` variables for a job EJS started with ``environ``.

    - ``APGAS_HOSTFILE``: EJS's node file, one place per node;
    - ``APGAS_LAUNCHER`` from ``LAUNCHER`` (:func:`launcher_for`; ``ssh``, EJS's
      default, when it is not set): places on the other nodes are started with it;
    - ``APGAS_INTERFACE``: the first node's address as EJS resolved it (EJS finds
      the job's node by it), which place 0, on that node, binds to and the other
      places reach; ``APGAS_LOCAL_HOSTS`` gets the first node's name, as this
      machine;
    - ``APGAS_SCHEDULER``: where EJS listens for the job's messages;
    - ``APGAS_MALLEABLE_LISTEN``: the first node's address at ``SCHEDULER_PORT``,
      where EJS sends its orders (never a wildcard: EJS finds the job by it);
    - ``APGAS_PLAIN_PROTOCOL=1``: EJS neither signs nor reads signed lines;
    - ``APGAS_THREADS`` from ``WORKERS`` when EJS gives it.

    ``APGAS_JOB_ID`` is cleared: towards EJS a message carries no job id.
    ConfigError names what is missing or wrong.
    """
    missing = [name for name in REQUIRED if not environ.get(name)]
    if missing:
        raise ConfigError(f"not a job of the ElasticJobScheduler: {', '.join(missing)} not set "
                          f"(EJS's launcher sets {', '.join(REQUIRED)})")
    port = environ["SCHEDULER_PORT"]
    if not 0 < (ascii_int(port) or 0) < 65536:
        raise ConfigError(f"SCHEDULER_PORT must be a TCP port, got {port!r}")
    try:
        scheduler = check_host(environ["SCHEDULER_IP"])
    except ValueError as e:
        raise ConfigError(f"SCHEDULER_IP must be the scheduler's address: {e}") from None
    launcher = launcher_for(environ.get("LAUNCHER") or "apgas.launcher.SshLauncher")
    workers = environ.get("WORKERS", "")
    if workers and not (ascii_int(workers) or 0) > 0:
        raise ConfigError(f"WORKERS must be a positive whole number, got {workers!r}")
    first, address = _first_node(environ["NODE_FILE"])
    local = [h.strip() for h in environ.get("APGAS_LOCAL_HOSTS", "").split(",") if h.strip()]
    env = {"APGAS_HOSTFILE": environ["NODE_FILE"],
           "APGAS_LAUNCHER": launcher,
           "APGAS_INTERFACE": address,
           "APGAS_LOCAL_HOSTS": ",".join(local if first in local else [*local, first]),
           "APGAS_SCHEDULER": f"{scheduler}:{port}",
           "APGAS_MALLEABLE_LISTEN": f"{address}:{port}",
           "APGAS_PLAIN_PROTOCOL": "1",
           "APGAS_JOB_ID": ""}
    if workers:
        env["APGAS_THREADS"] = workers
    return env


def _first_node(node_file: str) -> tuple[str, str]:
    """The first node of EJS's node file and its address, resolved as EJS does
    (``InetAddress.getByName``: the name's first IPv4 address), which must be one of
    this machine's: EJS runs the job script on the first node."""

    try:
        nodes = read_hostfile(node_file)
    except ValueError as e:
        raise ConfigError(f"NODE_FILE: {e}") from None
    if not nodes:
        raise ConfigError(f"NODE_FILE {node_file!r} names no node")
    first = nodes[0]
    try:
        address = socket.gethostbyname(first)
    except OSError as e:
        raise ConfigError(f"the first node {first!r} of NODE_FILE has no address: {e}") from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"the first node {first!r} of NODE_FILE has the address {address}, which is "
                    f"not one of this machine's: EJS runs the job script on the first node and "
                    f"sends its orders to that address, so the node names must resolve on the "
                    f"nodes as on EJS's machine") from None
    return first, address


def started_by_ejs(environ: Mapping[str, str]) -> bool:
    """Whether this job speaks EJS's dialect, as ``ejs-env`` sets it up: plain lines,
    no ``APGAS_JOB_ID`` (only our scheduler gives one), a scheduler to tell, and the
    socket communicator (the same rule as :class:`apgas.malleable.SocketMalleableCommunicator`)."""
    return (environ.get("APGAS_PLAIN_PROTOCOL", "").lower() in ("1", "true", "yes")
            and not environ.get("APGAS_JOB_ID") and bool(environ.get("APGAS_SCHEDULER"))
            and environ.get("APGAS_COMMUNICATOR", "") in ("", "socket"))


def startup_line(seconds: float) -> str:
    """The Java runtime's line once the places of the start have joined, which EJS's
    ``plotExperiments.py`` reads (``[APGAS] Place startup time: (\\d+\\.\\d+) sec``).
    Fixed-point, so that no exponent ever hides the figure from that pattern."""
    return f"[APGAS] Place startup time: {seconds:.9f} sec"


def initialization_line(seconds: float) -> str:
    """The Java GLB's line of its set-up time before the computation, which EJS's
    ``plotExperiments.py`` reads (``Initialization time \\(s\\); (\\d+\\.\\d+)``)."""
    return f"Initialization time (s); {seconds:.9f}"


def shell_exports(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines (``unset NAME`` for an empty value), quoted for sh."""
    return "".join(f"export {name}={shlex.quote(value)}\n" if value else f"unset {name}\n"
                   for name, value in env.items())
