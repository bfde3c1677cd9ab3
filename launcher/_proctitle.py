"""Process titles: what ``ps`` shows of a place and of the fork template.

A place's command line would otherwise be ``python -m apgas._serve --parent
3545 --place 2`` (and a forked place's the template's, ``--fork-server 4``):
nothing tells place 2 from place 3 without asking each its pid. With
:func:`set_title` it reads ``apgas place 2 (job 17, host node1) [apgas._serve
--parent 3545 --place 2]``. The bracket keeps the arguments that tools read
(:func:`serve_argv`): the tests' and the benchmarks' searches for the places of
a parent, which must see no orphan.

The title is written by ``setproctitle``, the library PostgreSQL-style servers
(and Celery, uWSGI, gunicorn) use: it rewrites the process's argv memory, so
``ps``, ``top``, ``pgrep -f`` and ``/proc/PID/cmdline`` all show it, and sets the
thread name (``/proc/PID/comm``) too. ``prctl(PR_SET_NAME)`` alone would change
only the 15 characters of ``comm``, which ``ps -eo args`` does not show. Without
the library the title is not set, silently: the places run all the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

__all__ = ["place_title", "template_title", "set_title", "serve_argv"]

MODULE = "apgas._serve"
_BRACKET = re.compile(r"\[" + re.escape(MODULE) + r"((?: [^\]]*)?)\]\s*$")


def place_title(place: int, host: str, argv: Sequence[str] | None) -> str:
    """``apgas place 2 (job 17, host node1) [apgas._serve --parent 3545 --place 2]``;
    the job is ``APGAS_JOB_ID``, left out when that is not set. An mpiexec rank
    (``argv`` None) runs the program, not ``apgas._serve``: ``[mpi rank]``."""
    job = os.environ.get("APGAS_JOB_ID", "")
    where = f"job {job}, host {host}" if job else f"host {host}"
    return f"apgas place {place} ({where}) {'[mpi rank]' if argv is None else _bracket(argv)}"


def template_title(parent: int, argv: Sequence[str]) -> str:
    """``apgas fork template (parent 3545) [apgas._serve --parent 3545 --fork-server 4]``."""
    return f"apgas fork template (parent {parent}) {_bracket(argv)}"


def _bracket(argv: Sequence[str]) -> str:
    return "[" + " ".join([MODULE, *argv]) + "]"


def set_title(title: str) -> bool:
    """Make ``title`` this process's command line; False if ``setproctitle`` is missing."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return False
    setproctitle(title)
    return True


def serve_argv(cmdline: bytes) -> list[str] | None:
    """The ``apgas._serve`` arguments of a process, from its ``/proc/PID/cmdline``:
    ``["--parent", "3545", "--place", "2"]``, whether the process has a title or
    not; None if it is no place nor template."""
    args = cmdline.decode(errors="replace").rstrip("\0").split("\0")
    if MODULE in args:
        return args[args.index(MODULE) + 1:]
    found = _BRACKET.search(" ".join(args))
    return found.group(1).split() if found else None
