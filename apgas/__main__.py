"""``python -m apgas -n N [-t T] script.py [args]``: run a script at place 0 of N places.

``python -m apgas ejs-env`` prints, for a job script run by the
ElasticJobScheduler, the ``export`` lines that map its environment onto ours
(:mod:`apgas.ejs`: node file, launcher, this node's address, the scheduler's);
on a bad or missing value it prints the reason and exits 2, so that the script
can stop before the program starts with the wrong places.

``python -m apgas timeline FILE --html OUT.html`` draws a run timeline written
with ``APGAS_TIMELINE=FILE`` (:mod:`apgas._timeline.recorder`) as one self-contained page.
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
    if args[:1] == ["timeline"]:
        return _timeline(args[1:])
    parser = argparse.ArgumentParser(
        prog="python -m apgas",
        description="Run SCRIPT at place 0 of an APGAS computation; the other places serve.",
        epilog="Other commands: 'python -m apgas timeline FILE --html OUT.html' draws a run "
               "timeline written with APGAS_TIMELINE=FILE; 'python -m apgas ejs-env' maps the "
               "ElasticJobScheduler's job environment onto APGAS_*.")
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
                    "environment (NODE_FILE, LAUNCHER, SCHEDULER_IP, SCHEDULER_PORT, WORKERS) "
                    "onto APGAS_*; exit 2 naming a bad or missing value. In the job script: "
                    "exports=$(python -m apgas ejs-env) || exit 1; eval \"$exports\"").parse_args(argv)
    try:
        print(shell_exports(ejs_environment(os.environ)), end="")
    except ApgasError as e:
        print(f"apgas ejs-env: error: {e}", file=sys.stderr)
        return 2
    return 0


def _timeline(argv: list[str]) -> int:
    from ._timeline.view import read_timeline, split_runs, timeline_model

    parser = argparse.ArgumentParser(
        prog="python -m apgas timeline",
        description="Draw a run timeline written with APGAS_TIMELINE=FILE: places over time, "
                    "work per place, resize orders.")
    parser.add_argument("file", help="the timeline (JSON lines)")
    parser.add_argument("--html", required=True, metavar="OUT.html", help="the page to write")
    parser.add_argument("--run", type=int, default=0, metavar="K",
                        help="which run of the file to draw, 1 = the first (default: the last)")
    ns = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"apgas timeline: error: {message}", file=sys.stderr)
        return 2

    try:
        events = read_timeline(ns.file)
    except FileNotFoundError:
        return fail(f"{ns.file}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        return fail(f"{ns.file}: cannot be read: {e}")
    except ValueError as e:
        return fail(str(e))  # it names file:line
    runs = len(split_runs(events))
    if not events:
        return fail(f"{ns.file}: the timeline is empty (no events)")
    if not 0 <= ns.run <= runs:
        return fail(f"{ns.file} holds {runs} run(s); --run must be between 1 and {runs}")
    try:
        model = timeline_model(events, ns.run - 1)
    except (ValueError, KeyError, TypeError) as e:
        return fail(f"{ns.file}: not a timeline apgas can draw: {e!r}")
    from .serving._webview import render_page

    try:
        with open(ns.html, "w", encoding="utf-8") as out:
            out.write(render_page(model))
    except OSError as e:
        return fail(f"cannot write {ns.html}: {e}")
    places = len(model["sections"][0]["rows"])
    orders = len(model["sections"][2]["rows"])
    print(f"wrote {ns.html}: {places} place(s), {orders} order(s), {model['t1']:.2f} s "
          f"(from {ns.file}{f', run {ns.run} of {runs}' if runs > 1 and ns.run else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
