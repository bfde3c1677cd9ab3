"""Launcher benchmark: start 4 places, grow by 2 and shrink by 2 with each launcher.

    python -m benchmarks.launchers [--repeats R] [--json FILE] [--quick]

Every launcher runs against real software on this machine: ``local``
(subprocesses), ``ssh`` (a throwaway sshd on 127.0.0.1, as in the tests),
``srun`` (a private 3-node Slurm on 127.0.0.1: slurmctld, three slurmd,
munge; the program runs under ``salloc -N3``) and ``mpi`` (``mpiexec -n 4``
from the mpich wheel; its grow goes through the local launcher). The
program measures, from just before ``apgas.run`` to ``main``'s first line,
the start of 4 places, then the ``grow 2`` and ``shrink 2`` orders it sends
itself (to the reply). Beside them, the bare cost of one process through the
same route (``ssh host true``, ``srun ... true``) shows what the launcher
itself costs. Figures are medians of R repeats; nothing is asserted.
Launchers whose daemons are missing are reported as skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import median, run_probe, scratch
from benchmarks._harness import Column, Run, Table, harness, show, skipped

log = logging.getLogger("benchmarks.launchers")
ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 120.0

PROBE = '''
import json, sys, time
t0 = time.perf_counter()
import apgas
from apgas.order import send_order

class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]

def order(address, line):
    return "\\n".join(send_order(address, line, timeout=60))

def main():
    ready = time.perf_counter() - t0
    places = len(apgas.places())
    address = apgas.define_malleable_handler(Newest()).address
    t = time.perf_counter()
    grow_reply = order(address, "grow 2 " + sys.argv[1].replace(",", " "))
    grow = time.perf_counter() - t
    t = time.perf_counter()
    shrink_reply = order(address, "shrink 2")
    shrink = time.perf_counter() - t
    ok = grow_reply.startswith("ok grow 2") and len(shrink_reply.split()) == 2
    return {"ready": ready, "places": places, "grow": grow, "shrink": shrink, "ok": ok,
            "replies": [grow_reply, shrink_reply]}

print("PROBE " + json.dumps(apgas.run(main)), flush=True)
'''


def _run(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    return run_probe(command, env, ROOT, RUN_TIMEOUT_S, lambda probe: probe["ok"] and probe["places"] == 4)


def _bare(command: list[str], env: dict[str, str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=30)
        times.append(time.perf_counter() - t)
    return median(times) or 0.0


def _routes(work: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    """For each launcher: the probe's command, environment and bare-process command."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _slurm import SlurmUnavailable, start_slurm
    from _sshd import SshUnavailable, start_sshd

    probe = work / "probe.py"
    probe.write_text(PROBE)
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "APGAS_MALLEABLE_LISTEN": "127.0.0.1:0"}
    py = sys.executable
    routes: dict[str, Any] = {
        "local": ([py, str(probe), "hostA,hostB"],
                  {**base, "APGAS_PLACES": "4", "APGAS_LOCAL_HOSTS": "*"}, [py, "-c", "pass"])}
    try:
        sshd = start_sshd(work / "sshd")
        stack.callback(sshd.stop)
        routes["ssh"] = ([py, str(probe), "sshhost1,sshhost2"],
                         {**base, "APGAS_LAUNCHER": "ssh", "APGAS_SSH": shlex.join(sshd.command),
                          "APGAS_HOSTS": "localhost,sshhost1,sshhost2,sshhost3"},
                         [*sshd.command, "sshhost1", py, "-c", "pass"])
    except (SshUnavailable, RuntimeError) as e:
        routes["ssh"] = f"skipped: {e}"
    try:
        slurm = start_slurm(work / "slurm")
        stack.callback(slurm.stop)
        salloc = ["salloc", "-N3", "--quiet", "--time=5", "--kill-command=SIGKILL"]
        routes["srun"] = ([*salloc, py, str(probe), "node2,node3"],
                          {**slurm.env, **{k: v for k, v in base.items() if k.startswith(("APGAS", "PY"))},
                           "APGAS_PLACES": "4"},
                          [*salloc, "srun", "-N1", "-n1", "-wnode2", "--overlap", py, "-c", "pass"])
    except (SlurmUnavailable, RuntimeError) as e:
        routes["srun"] = f"skipped: {e}"
    mpiexec = shutil.which("mpiexec", path=f"{Path(py).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if mpiexec:
        routes["mpi"] = ([mpiexec, "-n", "4", py, str(probe), "hostA,hostB"],
                         {**base, "APGAS_LOCAL_HOSTS": "*"}, [mpiexec, "-n", "1", py, "-c", "pass"])
    else:
        routes["mpi"] = "skipped: mpiexec not found (pip install mpich)"
    return routes


TABLE = Table([Column("launcher", 9, left=True), Column("start 4 places", 16, ".3f", " s"),
               Column("grow 2", 10, ".3f", " s"), Column("shrink 2", 10, ".3f", " s"),
               Column("one bare process", 19, ".3f", " s")])


@harness("benchmarks.launchers", __doc__, Path("bench-results/launchers.json"), "one repeat")
def main(run: Run) -> int:
    repeats = run.args.repeats or (1 if run.args.quick else 5)
    launchers: dict[str, Any] = {}
    run.report.update(repeats=repeats, launchers=launchers)
    with scratch("apgas-launchers-") as (work, stack):
        for name, route in _routes(work, stack).items():
            if isinstance(route, str):
                log.warning("%s: %s", name, route)
                launchers[name] = {"skipped": route}
                continue
            command, env, bare = route
            runs = []
            for i in range(repeats):
                runs.append(_run(command, env))
                log.info("%s %d/%d: ready %.3f s grow %.3f s shrink %.3f s", name, i + 1,
                         repeats, runs[-1]["ready"], runs[-1]["grow"], runs[-1]["shrink"])
            launchers[name] = {key: median([r[key] for r in runs]) for key in ("ready", "grow", "shrink")}
            launchers[name]["bare_process"] = _bare(bare, env, repeats)
            launchers[name]["samples"] = runs
    show("\n" + TABLE.render(skipped(name, row["skipped"]) if "skipped" in row else
                             [name, row["ready"], row["grow"], row["shrink"], row["bare_process"]]
                             for name, row in launchers.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
