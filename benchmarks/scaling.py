"""Strong scaling of the GLB applications over places and workers.

    python -m benchmarks.scaling [--apps uts,bc] [--quick] [--repeats R] [--quiet S] [--json FILE]

For each application: the kernel alone on one core (``--sequential``), two
copies of it at once, one per core (``sequential x2``: the machine's own
ceiling, since two busy cores of a virtual machine need not each run as fast
as one), then GLB on 1x1, 1x2 and 2x1 places x workers (this machine has 2
cores). Efficiency = sequential time / (GLB time x cores used), from the
medians of R runs of each; for ``sequential x2``, sequential time / the time
of the slower copy.

What is timed, the same way in both: ``python -m glb.apps`` times the
computation alone. The sequential run's timer covers ``app.sequential`` (the
bag built from the parameters and processed to the end, in one thread); the
GLB run's covers ``compute_dynamic`` (the places' GLB state set up, the bag
built, the work spread, processed, and the results and statistics collected).
Both leave out what precedes the computation: the interpreter's start-up and
imports, the start of the places, and the numba kernels' compile or load from
the disk cache (``app.warm_up``, at every place). Input that a bag builds on
first use (BC's graph) is built inside both timers: once in the sequential
run, once per place in a GLB run.

Where a GLB run's efficiency goes, from its own statistics: efficiency =
``kernel_speed`` x ``in_process``. ``in_process`` is the workers' time inside
the bag's ``process`` (GLB's ``busy_s``, summed over the places) over cores x
the GLB time: 1 - ``in_process`` is what GLB's set-up, its loop between two
chunks, the places' dry spells (steals, lifelines) and the end (termination,
results gathered) cost. ``kernel_speed`` = sequential time / that summed time
inside ``process``: how fast the kernel itself ran under GLB against alone
(the other core busy, ``process`` called in chunks of ``n`` units, the
runtime's own threads beside it); ``sequential x2`` is the machine's part of
it. ``in_process`` is the median over the same samples as ``seconds``, and
``kernel_speed`` = efficiency / ``in_process``, so that the two multiply to
the efficiency.

The machine is shared, and a run on 2 cores loses whatever any other process
takes, while the sequential run leaves it a core: so the runs are
interleaved (each round runs every configuration once, in a rotating order),
each run first waits up to ``--quiet`` seconds for the machine to be idle
(other processes below a tenth of a core for a second), and each sample
records the cores the machine's other processes used meanwhile
(``others_cores``: the machine's busy CPU time less this run's own, per
second of the run). The medians are over the calm runs, those during which
other processes took at most ``CROWDED`` (a tenth of a core) on average,
or over all runs when none was calm; every sample is kept in the JSON
(``samples``, ``others_cores``, ``calm_samples``, ``median_all``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._harness import Run, harness, show

log = logging.getLogger("benchmarks.scaling")

CONFIGS = [(1, 1), (1, 2), (2, 1)]
SIZES = {  # full, quick
    "uts": (["--depth", "13"], ["--depth", "10"]),
    "nqueens": (["-n", "16"], ["-n", "12"]),
    "pi": (["--samples", "4000000000"], ["--samples", "40000000"]),
    "bc": (["--scale", "13"], ["--scale", "10"]),
}
QUIET_CORES = 0.1   # the machine is idle when other processes use less than this ...
QUIET_WINDOW = 1.0  # ... over this many seconds
CROWDED = 0.1       # a run during which other processes took more cores than this (on
                    # average) is crowded: the medians leave it out, unless all runs were


def busy_seconds() -> float | None:
    """CPU seconds the machine has been busy since boot (all cores), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / ticks  # less idle and iowait


def children_cpu() -> float:
    """CPU seconds of this process's ended children (and theirs, when reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_quiet(patience: float) -> float:
    """Wait up to ``patience`` seconds for other processes to use under QUIET_CORES cores
    over QUIET_WINDOW s; returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < patience:
        before = busy_seconds()
        if before is None:
            break
        time.sleep(QUIET_WINDOW)
        if (busy_seconds() - before) / QUIET_WINDOW < QUIET_CORES:
            break
    return time.monotonic() - start


def run_once(app: str, args: list[str], copies: int = 1) -> dict:
    """One run of ``python -m glb.apps`` (``copies`` of it at once, each on its own core);
    its JSON record (the slowest copy's) plus ``others_cores``."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"r{i}.json" for i in range(copies)]
        busy, own, start = busy_seconds(), children_cpu(), time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "glb.apps", app, *args, "--json", str(out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for out in outs]
        try:
            errors = [proc.communicate()[1] for proc in procs]
        finally:
            for proc in procs:  # interrupted: leave no run behind
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        wall = time.monotonic() - start
        for proc, out, err in zip(procs, outs, errors, strict=True):
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"{app} {args} failed ({proc.returncode}): {err[-2000:]}")
        record = max((json.loads(out.read_text()) for out in outs), key=lambda r: r["seconds"])
    if busy is not None:
        others = max(0.0, busy_seconds() - busy - (children_cpu() - own))
        record["others_cores"] = others / wall
    return record


SEQUENTIAL, PAIR = "sequential", "sequential x2"
Config = tuple  # (kind, places, workers): kind is SEQUENTIAL, PAIR or "glb"


def configs(pair: bool = True) -> list[Config]:
    """The runs of one round for one app: the kernel alone, two copies of it at once (the
    machine's own ceiling for 2 cores, when ``pair``), then GLB on each of CONFIGS."""
    return ([(SEQUENTIAL, 1, 1)] + ([(PAIR, 1, 1)] if pair else [])
            + [("glb", p, w) for p, w in CONFIGS])


def plan(apps: list[str], rounds: int, pair: bool = True) -> list[tuple[int, str, Config]]:
    """(round, app, config) in run order: each round runs every app's configurations once,
    rotated by one per round so that none always runs first."""
    order = []
    for r in range(rounds):
        turn = configs(pair)
        turn = turn[r % len(turn):] + turn[:r % len(turn)]
        order += [(r, app, cfg) for app in apps for cfg in turn]
    return order


def measure(apps: list[str], quick: bool, repeats: int, quiet: float = 0.0,
            pair: bool = True) -> list[dict]:
    from tqdm import tqdm
    runs = plan(apps, repeats, pair)
    records: dict[tuple[str, Config], list[dict]] = {}
    waited = 0.0
    with tqdm(total=len(runs), desc="scaling", unit="run") as bar:
        for _, app, cfg in runs:
            kind, places, workers = cfg
            size = SIZES[app][1 if quick else 0]
            extra = ["--sequential"] if kind != "glb" else ["--places", str(places), "--workers", str(workers)]
            if quiet > 0:
                waited += wait_quiet(quiet)
            records.setdefault((app, cfg), []).append(
                run_once(app, size + extra, copies=2 if kind == PAIR else 1))
            bar.update()
    if quiet > 0:
        log.info("waited %.0f s in all for a quiet machine", waited)
    rows: list[dict] = []
    for app in apps:
        for cfg in configs(pair):
            kind, places, workers = cfg
            got = records[(app, cfg)]
            calm = [r for r in got if r.get("others_cores", 0.0) <= CROWDED]
            seconds = statistics.median(r["seconds"] for r in calm or got)
            inside = [in_process(r, places * workers) for r in calm or got]
            shares = [x for x in inside if x is not None]  # GLB runs only
            rows.append({"app": app, "size": SIZES[app][1 if quick else 0], "run": kind,
                         "places": places, "workers": workers, "sequential": kind != "glb",
                         "copies": 2 if kind == PAIR else 1, "seconds": seconds,
                         "samples": [r["seconds"] for r in got], "calm_samples": len(calm),
                         "median_all": statistics.median(r["seconds"] for r in got),
                         "others_cores": [round(r["others_cores"], 3) for r in got if "others_cores" in r],
                         "throughput": got[0]["units"] / seconds, "unit_name": got[0]["unit_name"],
                         "correct": all(r["correct"] is not False for r in got),
                         "result": got[0]["result"],
                         "in_process": (statistics.median(shares) if len(shares) == len(inside)
                                        else None)})
    for app in apps:
        base = next(r["seconds"] for r in rows if r["app"] == app and r["run"] == SEQUENTIAL)
        for r in rows:
            if r["app"] == app:
                # two copies do twice the work on two cores: base / seconds, as for 1 core
                cores = r["places"] * r["workers"]
                r["speedup"] = base * r["copies"] / r["seconds"]
                r["efficiency"] = r["speedup"] / (cores * r["copies"])
                r["kernel_speed"] = (r["efficiency"] / r["in_process"]
                                     if r["in_process"] else None)
    return rows


def in_process(record: dict, cores: int) -> float | None:
    """The share of a GLB run's cores x seconds its workers spent inside the bag's
    ``process`` (the places' ``busy_s`` summed); None for a sequential run."""
    stats = record.get("glb_stats")
    if not stats or record["seconds"] <= 0:
        return None
    return sum(s["busy_s"] for s in stats) / (cores * record["seconds"])


def render(rows: list[dict]) -> str:
    lines = [f"{'app':<8} {'run':<14} {'seconds':>9} {'throughput':>16} {'speedup':>8} {'efficiency':>10}"
             f" {'in process':>10} {'kernel':>7}  correct  others (cores, max)"]
    for r in rows:
        run = r["run"] if r["sequential"] else f"{r['places']}p x {r['workers']}w"
        others = f"{max(r['others_cores']):.2f}" if r.get("others_cores") else "-"
        inside = f"{r['in_process']:.1%}" if r.get("in_process") else "-"
        kernel = f"{r['kernel_speed']:.1%}" if r.get("kernel_speed") else "-"
        lines.append(f"{r['app']:<8} {run:<14} {r['seconds']:>9.3f} {r['throughput']:>12,.0f}/s   "
                     f"{r['speedup']:>7.2f} {r['efficiency']:>9.1%} {inside:>10} {kernel:>7}  "
                     f"{str(r['correct']):<7}  {others}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    apps = sorted({r["app"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(CONFIGS))
    for k, (p, w) in enumerate(CONFIGS):
        values = [next(r["efficiency"] for r in rows if r["app"] == a and not r["sequential"]
                       and (r["places"], r["workers"]) == (p, w)) for a in apps]
        ax.bar([i + k * width for i in range(len(apps))], values, width, label=f"{p} place(s) x {w} worker(s)")
    ceilings = [next((r["efficiency"] for r in rows if r["app"] == a and r["run"] == PAIR), None)
                for a in apps]
    for i, c in enumerate(ceilings):
        if c is not None:
            ax.plot([i + width / 2, i + (len(CONFIGS) - 0.5) * width], [c, c], color="black",
                    linewidth=1.5, label="machine: 2 sequential runs at once" if i == 0 else None)
    ax.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="95% target")
    ax.set_xticks([i + width for i in range(len(apps))], apps)
    ax.set_ylabel("parallel efficiency vs. sequential kernel")
    top = max(r["efficiency"] for r in rows)
    ax.set_ylim(0, max(1.2, top * 1.1))
    ax.set_title("GLB strong scaling on this 2-core machine")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apps", default="uts,nqueens", help="comma-separated: uts,nqueens,pi,bc")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each runs every configuration once")
    parser.add_argument("--quiet", type=float, default=None, metavar="S",
                        help="before each run, wait up to S seconds for the machine to be idle "
                             "(default 30, 0 with --quick; 0: do not wait)")
    parser.add_argument("--no-pair", action="store_true",
                        help="skip the two sequential copies at once (the machine's ceiling)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke test")
    parser.add_argument("--json", type=Path, default=Path("bench-results/scaling.json"))


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the list of apps."""
    args.apps = [a for a in args.apps.split(",") if a]
    unknown = [a for a in args.apps if a not in SIZES]
    if unknown:
        return f"unknown app(s) {unknown}; choose from {sorted(SIZES)}"
    return None


@harness("benchmarks.scaling", __doc__, options=options,
         check=check, needs=lambda args: ["numba", "tqdm", "matplotlib"], loggers=(log.name,))
def main(run: Run) -> int:
    args = run.args
    quiet = args.quiet if args.quiet is not None else (0.0 if args.quick else 30.0)
    load_before = os.getloadavg()
    rows = measure(args.apps, args.quick, 1 if args.quick else args.repeats, quiet, not args.no_pair)
    show(render(rows))
    run.report.update(load_before=load_before, quiet_wait_s=quiet, rows=rows)
    png = args.json.with_suffix(".png")
    plot(rows, png)
    log.info("plot in %s", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
