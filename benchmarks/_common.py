"""What the benchmarks share: metrics and samples, formatting, machine info, JSON, logging, arguments."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# -- metrics and samples ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Metric:
    """One row of a table."""

    key: str
    label: str
    unit: str                        # "s", "us" or "tasks/s"
    higher_is_better: bool
    target: float | None = None


Samples = dict[str, list[float]]  # metric key -> one value per repeat


def add_sample(samples: Samples, key: str, value: float) -> None:
    """Append ``value`` to the samples of ``key``."""
    samples.setdefault(key, []).append(value)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in (0, 100]."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def median(values: list[float] | None) -> float | None:
    """The median, or None without values."""
    return statistics.median(values) if values else None


def meets(m: Metric, value: float | None) -> bool | None:
    """Whether ``value`` meets the metric's target; None without a target or a value."""
    if m.target is None or value is None:
        return None
    return value >= m.target if m.higher_is_better else value <= m.target


# -- formatting ---------------------------------------------------------------------------

def fmt(value: float | None, unit: str) -> str:
    """A value in its unit, for a table cell."""
    if value is None:
        return "-"
    if unit == "tasks/s":
        return f"{value:,.0f}/s"
    if unit == "us":
        return f"{value:,.1f} us"
    return f"{value:.3f} s"


def fmt_target(m: Metric, verdict: bool | None) -> str:
    """The metric's target and whether it was met, or "" without a target."""
    if m.target is None:
        return ""
    bound = (">= " if m.higher_is_better else "<= ") + fmt(m.target, m.unit)
    return f"{bound} ({'met' if verdict else 'missed' if verdict is not None else 'n/a'})"


# -- machine and output -------------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    """Where and when the benchmark ran."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": sys.version,
        "versions": {name: _version(name) for name in ("apgas", "pyzmq", "cloudpickle", "distributed")},
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _version(dist: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    """Output of a git command in this checkout, or None."""
    try:
        out = subprocess.run(["git", *args], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def write_json(path: Path, report: dict[str, Any], logger: logging.Logger | None = None) -> None:
    """Write ``report`` to ``path`` (parents created); log it under ``logger`` or ``benchmarks``.
    What JSON has no type for is written as its ``str``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    (logger or logging.getLogger("benchmarks")).info("wrote %s", path)


# -- programs that print their result -------------------------------------------------------

def communicate_or_kill(proc: subprocess.Popen, timeout: float) -> tuple[Any, Any]:
    """``proc.communicate()`` for a process started with ``start_new_session=True``;
    its whole process group is killed if it takes longer than ``timeout`` s."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


EXTRA_OF = {"distributed": "bench", "tqdm": "bench", "matplotlib": "bench", "numba": "apps",
            "numpy": "apps", "mpi4py": "mpi", "selenium": "dev"}
"""The extra of pyproject.toml that brings each module a harness may need."""


def missing(*modules: str) -> list[str]:
    """Those of ``modules`` that cannot be imported here (looked up, not imported)."""
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True
    return [m for m in modules if absent(m)]


def install_hint(modules: list[str]) -> str:
    """``numba (the apps extra), tqdm (the bench extra): .venv/bin/pip install -e ".[apps,bench]"``."""
    extras = sorted({EXTRA_OF.get(m, "dev") for m in modules})
    named = ", ".join(f"{m} (the {EXTRA_OF.get(m, 'dev')} extra)" for m in modules)
    return f'{named}: .venv/bin/pip install -e ".[{",".join(extras)}]"'


def require(harness: str, *modules: str) -> None:
    """Exit with status 2, before measuring anything, when ``harness`` (``benchmarks.micro``)
    cannot import one of ``modules``, saying which extra to install."""
    if absent := missing(*modules):
        print(f"{harness} needs {install_hint(absent)}", file=sys.stderr)
        raise SystemExit(2)


def have_dask() -> bool:
    """Whether Dask distributed (the ``bench`` extra) can be imported."""
    return not missing("distributed")


def with_cli(app_name: str, args: list[str], env: dict[str, str] | None = None,
             timeout: float | None = None) -> dict:
    """One run of ``python -m glb.apps APP ARGS``; its JSON record (RuntimeError with
    the command and the end of its error output if it fails)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "glb.apps", app_name, *args, "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def tagged_results(proc: subprocess.Popen, tag: str, timeout: float) -> tuple[list[Any], str, str]:
    """Wait for ``proc`` (started with ``start_new_session=True`` and text pipes),
    killing its process group after ``timeout`` s; the JSON values of its output
    lines that start with ``tag``, its output and its error output."""
    out, err = communicate_or_kill(proc, timeout)
    found = [json.loads(line[len(tag):]) for line in out.splitlines() if line.startswith(tag)]
    return found, out, err


def run_probe(command: list[str], env: dict[str, str], cwd: Path, timeout: float,
              accept: Callable[[Any], bool]) -> Any:
    """Run a probe program; the first of its ``PROBE <json>`` values that ``accept``
    takes, else RuntimeError with the command and the end of its error output."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    found, _, err = tagged_results(proc, "PROBE ", timeout)
    for probe in found:
        if accept(probe):
            return probe
    raise RuntimeError(f"{shlex.join(command)} failed (exit {proc.returncode}): {err[-3000:]}")


# -- environment, logging and command line ---------------------------------------------------

class scheduler_env_aside:  # noqa: N801 (used as a context manager, like a function)
    """Environment variables that would tie the runs to a scheduler, put aside meanwhile."""

    VARS = ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_MALLEABLE_LISTEN")

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.saved: dict[str, str] = {}
        self.log = logger or logging.getLogger("benchmarks")

    def __enter__(self) -> scheduler_env_aside:
        for var in self.VARS:
            if var in os.environ:
                self.saved[var] = os.environ.pop(var)
                self.log.warning("%s ignored: the benchmark runs its own jobs", var)
        return self

    def __exit__(self, *exc: object) -> None:
        os.environ.update(self.saved)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[tuple[Path, contextlib.ExitStack]]:
    """A temporary directory, and a stack for what is started in it (sshd, Slurm): on
    exit that is stopped, in reverse order, before the directory goes."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, contextlib.ExitStack() as stack:
        yield Path(tmp), stack


def positive_ints(text: str) -> list[int]:
    """An option's ``2,4``: positive integers separated by commas."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def setup_logging(*logger_names: str) -> None:
    """The named benchmark loggers at INFO; other libraries (Dask) only from WARNING."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or r.name.startswith("benchmarks"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    for name in logger_names:
        logging.getLogger(name).setLevel(logging.INFO)


def parse_args(argv: list[str] | None, prog: str, doc: str, default_json: Path | None,
               quick_help: str | None,
               options: Callable[[argparse.ArgumentParser], None] | None = None, *,
               repeats: bool = True, check: Callable[[argparse.Namespace], str | None] | None = None,
               whole_doc: bool = False) -> argparse.Namespace:
    """The harness's own ``options``, then those of ``--repeats``, ``--json`` (when
    ``default_json`` is given) and ``--quick`` (when ``quick_help`` is) that it did not
    define itself; the description is the first line of ``doc`` (or all of it)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc if whole_doc else doc.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter
                                     if whole_doc else argparse.HelpFormatter)
    if options is not None:
        options(parser)
    own = parser._option_string_actions  # the options the harness defined
    if repeats and "--repeats" not in own:
        parser.add_argument("--repeats", type=int, default=None, help="repeats of each measurement "
                            "(default 5, or 1 with --quick)")
    if default_json is not None and "--json" not in own:
        parser.add_argument("--json", type=Path, default=default_json,
                            help="where to write the results (default: %(default)s)")
    if quick_help is not None and "--quick" not in own:
        parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args(argv)
    if getattr(args, "repeats", None) is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if check is not None and (wrong := check(args)):
        parser.error(wrong)
    return args


ROOT = Path(__file__).resolve().parent.parent


class CheckoutError(Exception):
    """A commit could not be checked out; the message names it and says git's words."""


@contextlib.contextmanager
def checked_out(revs: list[str], prefix: str) -> Iterator[dict[str, Path]]:
    """Each commit of ``revs`` checked out into a temporary git worktree (detached),
    then this tree as ``"this tree"``; the worktrees are removed at the end.
    Raises :class:`CheckoutError` if a commit cannot be checked out."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        trees: dict[str, Path] = {}
        try:
            for rev in revs:
                tree = Path(tmp) / rev.replace("/", "_")
                try:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                                    rev], check=True, capture_output=True, text=True)
                except subprocess.CalledProcessError as e:
                    raise CheckoutError(f"cannot check out {rev!r}: {e.stderr.strip()}") from e
                trees[rev] = tree
            yield {**trees, "this tree": ROOT}
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True, text=True)


def run_in_tree(tree: Path, code: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python -c code *args`` with ``tree``'s code first on the path; the JSON object
    its last line prints, once it is checked that it imported ``tree``'s own apgas (the
    object's ``apgas`` key, which is taken out)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"the measurement in {tree} failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    imported = result.pop("apgas")
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the run in {tree} imported apgas from {imported}")
    return result
