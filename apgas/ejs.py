"""Run a job under the ElasticJobScheduler (EJS) of malleable APGAS for Java.

EJS starts a job with its own variables (``NODE_FILE``, ``SCHEDULER_IP``,
``SCHEDULER_PORT``, ``WORKERS``, ...) and sends orders to the job's first node
at ``SCHEDULER_PORT``. :func:`ejs_environment` maps them onto ours, and
``python -m apgas ejs-env`` prints them for a job script::

    eval "$(python -m apgas ejs-env)"
    python -m apgas my_program.py

What the job then does differently (only the lines EJS knows, plain lines,
no job id, requests without answers) is in ``docs/protocol.md``; so are EJS's
limits (20 s for a shrink's reply, 60 s between resizes, one node per request).
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Mapping

from .errors import ConfigError

__all__ = ["ejs_environment", "shell_exports"]

#: EJS's variables a job needs; without them this is not a job EJS started.
REQUIRED = ("NODE_FILE", "SCHEDULER_IP", "SCHEDULER_PORT")


def ejs_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``APGAS_*`` variables for a job EJS started with ``environ``.

    - ``APGAS_HOSTFILE``: EJS's node file, one place per node;
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
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"SCHEDULER_PORT must be a TCP port, got {port!r}")
    from launcher import read_hostfile  # here: launcher imports apgas on its way in

    try:
        nodes = read_hostfile(environ["NODE_FILE"])
    except ValueError as e:
        raise ConfigError(f"NODE_FILE: {e}") from None
    if not nodes:
        raise ConfigError(f"NODE_FILE {environ['NODE_FILE']!r} names no node")
    try:
        first = socket.gethostbyname(nodes[0])
    except OSError as e:
        raise ConfigError(f"the first node {nodes[0]!r} of NODE_FILE has no address: {e}") from None
    env = {"APGAS_HOSTFILE": environ["NODE_FILE"],
           "APGAS_SCHEDULER": f"{environ['SCHEDULER_IP']}:{port}",
           "APGAS_MALLEABLE_LISTEN": f"{first}:{port}",
           "APGAS_PLAIN_PROTOCOL": "1",
           "APGAS_JOB_ID": ""}
    workers = environ.get("WORKERS", "")
    if workers.isdigit() and int(workers) > 0:
        env["APGAS_THREADS"] = workers
    return env


def shell_exports(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines (``unset NAME`` for an empty value), quoted for sh."""
    return "".join(f"export {name}={shlex.quote(value)}\n" if value else f"unset {name}\n"
                   for name, value in env.items())
