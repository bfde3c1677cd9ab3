"""``python -m apgas -n N [-t T] script.py [args]``: run a script at place 0 of N places.

``python -m apgas ejs-env`` prints, for a job script run by the
ElasticJobScheduler, the ``export`` lines that map its environment onto ours
(:mod:`apgas.ejs`).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ._run import run
from .errors import ApgasError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["ejs-env"]:
        return _ejs_env(args[1:])
    parser = argparse.ArgumentParser(
        prog="python -m apgas",
        description="Run SCRIPT at place 0 of an APGAS computation; the other places serve.")
    parser.add_argument("-n", "--places", type=int, help="number of places (default: APGAS_PLACES, "
                        "else one per APGAS_HOSTS entry, else 1)")
    parser.add_argument("-t", "--threads", type=int, help="worker threads per place (default: APGAS_THREADS, "
                        "else the number of cores)")
    parser.add_argument("script", help="the Python program to run at place 0")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    ns = parser.parse_args(argv)
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script!r} not found")
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    try:
        run(lambda: runpy.run_path(ns.script, run_name="__main__"), places=ns.places, threads=ns.threads)
    except ApgasError as e:
        print(f"apgas: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _ejs_env(argv: list[str]) -> int:
    from .ejs import ejs_environment, shell_exports

    argparse.ArgumentParser(
        prog="python -m apgas ejs-env",
        description="Print the export lines that map the ElasticJobScheduler's job "
                    "environment onto APGAS_*: eval \"$(python -m apgas ejs-env)\"").parse_args(argv)
    try:
        print(shell_exports(ejs_environment(os.environ)), end="")
    except ApgasError as e:
        print(f"apgas ejs-env: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
