"""How mpiexec runs of a correct APGAS program end: exit codes over many runs.

    python -m benchmarks.mpi_exits [--runs N] [--ranks R] [--json FILE]

Each run is ``mpiexec -verbose -n R python PROBE`` (MPICH's hydra from the
mpich wheel); the probe starts one place per rank, asks every place for its
pid and exits. A run is *clean* when mpiexec exits 0, it printed the probe's
result, and hydra's proxy received a PMI ``finalize`` from every rank: a rank
that ends without one is taken for a crash, and the proxy SIGKILLs the ranks
still running (the job then exits 9 when one of them had not finalized). The
table counts the runs, the clean ones, the exit codes and the ranks whose
finalize was missing, with the median and slowest run time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import median, percentile
from benchmarks._harness import Run, harness, show

__all__ = ["RunOutcome", "run_once", "run_many", "main"]

log = logging.getLogger("benchmarks.mpi_exits")
ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 60.0

# hydra's verbose lines share stdout with the ranks' output, so the result goes to a file
PROBE = """
import os, sys, apgas
pids = apgas.run(lambda: [apgas.at(p, os.getpid) for p in apgas.places()])
with open(sys.argv[1], "w") as f:
    f.write(str(len(set(pids))))
"""

_FINALIZE = re.compile(r"got pmi command from downstream \d+-(\d+):\s*\n\s*cmd=finalize\b")


def mpiexec_path() -> str | None:
    """The mpiexec beside this interpreter (the mpich wheel), else one on PATH."""
    return shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                         os.environ.get("PATH", "")]))


@dataclasses.dataclass
class RunOutcome:
    """One mpiexec run: exit code, whether the probe answered, which ranks finalized."""

    code: int
    answered: bool
    finalized: set[int]
    ranks: int
    seconds: float
    stderr_tail: str = dataclasses.field(repr=False)

    @property
    def missing_finalize(self) -> list[int]:
        """Ranks from which hydra's proxy got no PMI finalize."""
        return sorted(set(range(self.ranks)) - self.finalized)

    @property
    def clean(self) -> bool:
        return self.code == 0 and self.answered and not self.missing_finalize


def run_once(mpiexec: str, ranks: int, timeout: float = RUN_TIMEOUT_S) -> RunOutcome:
    """One ``mpiexec -verbose -n ranks`` run of the probe, killed after ``timeout`` seconds."""
    env = {**os.environ, "APGAS_LOCAL_HOSTS": "*", "PYTHONUNBUFFERED": "1"}
    env.pop("APGAS_LAUNCHER", None)
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch, "result")
        started = time.perf_counter()
        proc = subprocess.Popen([mpiexec, "-verbose", "-n", str(ranks), sys.executable, "-c", PROBE,
                                 str(result)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        seconds = time.perf_counter() - started
        answered = result.exists() and result.read_text() == str(ranks)
    finalized = {int(rank) for rank in _FINALIZE.findall(out + err)}
    tail = "\n".join(line for line in err.splitlines() if not line.startswith(("[proxy", "[mpiexec", "    ")))
    return RunOutcome(proc.returncode, answered, finalized, ranks, seconds, tail[-2000:])


def run_many(runs: int, ranks: int, progress: bool = False) -> list[RunOutcome]:
    """``runs`` consecutive runs (a progress bar on a terminal when ``progress``)."""
    mpiexec = mpiexec_path()
    if mpiexec is None:
        raise OSError("mpiexec not found: pip install 'apgas[mpi]' (mpi4py and mpich from PyPI)")
    steps = range(runs)
    if progress:
        try:
            from tqdm import tqdm
            steps = tqdm(steps, desc=f"mpiexec -n {ranks}", unit="run")
        except ImportError:
            pass
    outcomes = []
    for _ in steps:
        outcome = run_once(mpiexec, ranks)
        if not outcome.clean:
            log.warning("run %d not clean: %r\n%s", len(outcomes) + 1, outcome, outcome.stderr_tail)
        outcomes.append(outcome)
    return outcomes


def summary(outcomes: list[RunOutcome]) -> dict[str, Any]:
    """The figures of the table, as a dictionary for JSON."""
    seconds = [o.seconds for o in outcomes]
    return {
        "runs": len(outcomes),
        "clean": sum(o.clean for o in outcomes),
        "exit_codes": dict(sorted(collections.Counter(o.code for o in outcomes).items())),
        "runs_missing_a_finalize": sum(bool(o.missing_finalize) for o in outcomes),
        "runs_without_result": sum(not o.answered for o in outcomes),
        "median_s": median(seconds),
        "p95_s": percentile(seconds, 95) if seconds else None,
        "max_s": max(seconds, default=None),
    }


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=100, help="consecutive runs (default %(default)s)")
    parser.add_argument("--ranks", type=int, default=3, help="ranks per run (default %(default)s)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/mpi_exits.json"),
                        help="where to write the results (default: %(default)s)")


def check(args: argparse.Namespace) -> str | None:
    if args.runs < 1 or args.ranks < 1:
        return f"--runs and --ranks must be at least 1, got {args.runs} and {args.ranks}"
    return None


@harness("benchmarks.mpi_exits", __doc__, Path("bench-results/mpi_exits.json"), repeats=False,
         options=options, check=check, needs=lambda args: ["mpi4py"])
def main(run: Run) -> int:
    args = run.args
    outcomes = run_many(args.runs, args.ranks, progress=sys.stderr.isatty())
    figures = summary(outcomes)
    codes = ", ".join(f"{code}: {n}" for code, n in figures["exit_codes"].items())
    show(f"| mpiexec -n {args.ranks} runs | clean | exit codes | missing a PMI finalize "
         "| median | p95 | slowest |", "| --- | --- | --- | --- | --- | --- | --- |",
         f"| {figures['runs']} | {figures['clean']} | {codes} | {figures['runs_missing_a_finalize']} "
         f"| {figures['median_s']:.3f} s | {figures['p95_s']:.3f} s | {figures['max_s']:.3f} s |")
    run.report.update({"ranks": args.ranks, **figures})
    return 0 if figures["clean"] == figures["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
