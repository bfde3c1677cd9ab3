"""How ``benchmarks.elastisim_compare`` runs a job set in ElastiSim: the test helpers
that find the built simulator, the bridge, and one run of a Kassel original or of
one of our policies, read back from its job statistics."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from apgas_scheduler.sim.elastisim_jobs import JobSet
from apgas_scheduler.stats import JobTimes, summarize
from benchmarks._elastisim_output import reconfigurations

__all__ = ["RunFailed", "HELPERS", "load_helpers", "elastisim_status", "bridge_status",
           "read_job_statistics", "run_elastisim"]

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "tests" / "_elastisim.py"


class RunFailed(RuntimeError):
    """An ElastiSim run that did not end as it should; the message says how."""


def load_helpers() -> tuple[ModuleType | None, str]:
    """``tests/_elastisim.py`` (find, prepare_input, run_elastisim, run_strategy,
    stop), or None and why not."""
    if not HELPERS.is_file():
        return None, f"{HELPERS.relative_to(ROOT)} (the helpers that run ElastiSim) is missing"
    spec = importlib.util.spec_from_file_location("_elastisim_helpers", HELPERS)
    if spec is None or spec.loader is None:
        return None, f"{HELPERS} cannot be loaded"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, ""


def elastisim_status(helpers: ModuleType | None, reason: str) -> tuple[Path | None, str]:
    """The ElastiSim build folder, or None and why the ElastiSim runs are skipped."""
    if helpers is None:
        return None, reason
    folder, why = helpers.find()
    return (Path(folder), "") if folder is not None else (None, why)


def bridge_status() -> str:
    """Why our policies cannot run in ElastiSim ("" if they can): the bridge
    ``apgas-scheduler elastisim`` must be there."""
    if importlib.util.find_spec("apgas_scheduler.elastisim") is None:
        return "the bridge (apgas_scheduler/elastisim.py, `apgas-scheduler elastisim`) is missing"
    proc = subprocess.run([sys.executable, "-m", "apgas_scheduler", "elastisim", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          stdin=subprocess.DEVNULL, env=_env())
    if proc.returncode != 0:
        return "`apgas-scheduler elastisim` is not a subcommand yet (apgas_scheduler/__main__.py)"
    return ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def read_job_statistics(path: Path) -> dict[int, dict[str, Any]]:
    """ElastiSim's ``job_statistics.csv``: id -> submit, start, end, type, status."""
    out: dict[int, dict[str, Any]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out[int(row["ID"])] = {"submit": float(row["Submit Time"]),
                                   "start": float(row["Start Time"]), "end": float(row["End Time"]),
                                   "type": row["Type"], "status": row["Status"]}
    return out


def _kassel_resizes(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, newline="", encoding="utf-8") as f:
        return sum(1 for row in csv.DictReader(f) if row.get("Event") in ("EXPAND", "SHRINK"))


def run_elastisim(helpers: ModuleType, folder: Path, input_dir: Path, work: Path, jobset: JobSet,
                  *, strategy: str | None = None, policy: str | None = None,
                  resize_interval: float = 10.0, timeout: float = 900.0) -> dict[str, Any]:
    """The set in the real ElastiSim, with the Kassel ``strategy`` or our ``policy``
    through the bridge; metrics and per-job times like :func:`run_ours`."""
    work.mkdir(parents=True)
    config = helpers.prepare_input(work, input_dir)
    settings = json.loads(config.read_text())
    started = time.perf_counter()
    sim = helpers.run_elastisim(folder / "build" / "elastisim", config)
    algorithm: subprocess.Popen[bytes] | None = None
    try:
        if strategy is not None:
            algorithm = helpers.run_strategy(folder, strategy, config)
        else:
            with open(work / "bridge.log", "wb") as out:
                algorithm = subprocess.Popen(
                    [sys.executable, "-m", "apgas_scheduler", "elastisim", "--policy", str(policy),
                     "--url", settings["zmq_url"], "--stats", str(work / "bridge.json"),
                     "--node-speed", repr(jobset.node_speed),
                     "--resize-interval", repr(resize_interval)],
                    cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            codes = sim.poll(), algorithm.poll()
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() > deadline:
                raise RunFailed(f"not done after {timeout:g} s")
            time.sleep(0.1)
    finally:
        for proc in (sim, algorithm):
            if proc is not None and proc.poll() is None:
                helpers.stop(proc)
    if sim.returncode != 0 or algorithm.returncode != 0:
        logs = sorted(work.glob("*.log"))
        tail = "; ".join(f"{p.name}: {p.read_text(errors='replace').strip()[-300:]}" for p in logs)
        raise RunFailed(f"ElastiSim exited {sim.returncode}, the algorithm {algorithm.returncode} "
                        f"({tail})")
    stats_file = Path(settings["job_statistics"])
    if not stats_file.is_file():
        raise RunFailed(f"ElastiSim wrote no {stats_file}")
    rows = read_job_statistics(stats_file)
    times = [JobTimes(r["submit"], r["start"], r["end"], cls=r["type"]) for r in rows.values()]
    summary = summarize(times)
    label = f"{strategy} (Kassel)" if strategy else f"{policy} (bridge)"
    if strategy:
        orders = _kassel_resizes(work / "output" / "event.csv")
        counts: dict[str, Any] = {}
    else:
        counts = json.loads((work / "bridge.json").read_text())
        orders = counts["decisions"]["grow"] + counts["decisions"]["shrink"]
    utilization = Path(settings["node_utilization"])
    resizes = reconfigurations(utilization) if utilization.is_file() else orders
    return {"simulator": "ElastiSim", "policy": strategy or policy, "label": label,
            "metrics": {"jobs": len(rows), "makespan": summary["makespan"],
                        "mean_wait": summary["mean_wait"],
                        "mean_turnaround": summary["mean_turnaround"],
                        "mean_bounded_slowdown": summary["mean_bounded_slowdown"],
                        "resizes": resizes, "orders": orders,
                        "killed": sum(1 for r in rows.values() if r["status"] != "completed")},
            "jobs": {jid: [r["start"], r["end"]] for jid, r in rows.items()},
            "bridge": counts, "seconds": time.perf_counter() - started}


# -- comparisons -------------------------------------------------------------------------------
