"""Strong scaling of the GLB applications over places and workers.

    python -m benchmarks.scaling [--apps uts,nqueens] [--quick] [--repeats R] [--json FILE]

For each application: the kernel alone on one core (``--sequential``), then
GLB on 1x1, 1x2 and 2x1 places x workers (this machine has 2 cores); the
median of R runs of each. Efficiency = sequential time / (GLB time x cores
used). Prints a table, writes JSON and a PNG plot beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ._common import machine_info, setup_logging, write_json

log = logging.getLogger("benchmarks.scaling")

CONFIGS = [(1, 1), (1, 2), (2, 1)]
SIZES = {  # full, quick
    "uts": (["--depth", "13"], ["--depth", "10"]),
    "nqueens": (["-n", "16"], ["-n", "12"]),
    "pi": (["--samples", "4000000000"], ["--samples", "40000000"]),
    "bc": (["--scale", "13"], ["--scale", "10"]),
}


def run_once(app: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        proc = subprocess.run([sys.executable, "-m", "glb.apps", app, *args, "--json", str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{app} {args} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def measure(apps: list[str], quick: bool, repeats: int) -> list[dict]:
    from tqdm import tqdm
    plan = [(app, cfg) for app in apps for cfg in [None, *CONFIGS]]
    rows: list[dict] = []
    with tqdm(total=len(plan) * repeats, desc="scaling", unit="run") as bar:
        for app, cfg in plan:
            size = SIZES[app][1 if quick else 0]
            extra = ["--sequential"] if cfg is None else ["--places", str(cfg[0]), "--workers", str(cfg[1])]
            records = []
            for _ in range(repeats):
                records.append(run_once(app, size + extra))
                bar.update()
            seconds = statistics.median(r["seconds"] for r in records)
            rows.append({"app": app, "size": size, "places": cfg[0] if cfg else 1,
                         "workers": cfg[1] if cfg else 1, "sequential": cfg is None,
                         "seconds": seconds, "samples": [r["seconds"] for r in records],
                         "throughput": records[0]["units"] / seconds, "unit_name": records[0]["unit_name"],
                         "correct": all(r["correct"] is not False for r in records),
                         "result": records[0]["result"]})
    for app in apps:
        base = next(r["seconds"] for r in rows if r["app"] == app and r["sequential"])
        for r in rows:
            if r["app"] == app:
                cores = r["places"] * r["workers"]
                r["speedup"] = base / r["seconds"]
                r["efficiency"] = base / (r["seconds"] * cores)
    return rows


def render(rows: list[dict]) -> str:
    lines = [f"{'app':<8} {'run':<12} {'seconds':>9} {'throughput':>16} {'speedup':>8} {'efficiency':>10}  correct"]
    for r in rows:
        run = "sequential" if r["sequential"] else f"{r['places']}p x {r['workers']}w"
        lines.append(f"{r['app']:<8} {run:<12} {r['seconds']:>9.3f} {r['throughput']:>12,.0f}/s   "
                     f"{r['speedup']:>7.2f} {r['efficiency']:>9.1%}  {r['correct']}")
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
    ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="90% target")
    ax.set_xticks([i + width for i in range(len(apps))], apps)
    ax.set_ylabel("parallel efficiency vs. sequential kernel")
    top = max(r["efficiency"] for r in rows)
    ax.set_ylim(0, max(1.2, top * 1.1))
    ax.set_title("GLB strong scaling on this 2-core machine")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--apps", default="uts,nqueens", help="comma-separated: uts,nqueens,pi,bc")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke test")
    parser.add_argument("--json", type=Path, default=Path("bench-results/scaling.json"))
    args = parser.parse_args(argv)
    apps = [a for a in args.apps.split(",") if a]
    unknown = [a for a in apps if a not in SIZES]
    if unknown:
        parser.error(f"unknown app(s) {unknown}; choose from {sorted(SIZES)}")
    setup_logging(log.name)
    rows = measure(apps, args.quick, 1 if args.quick else args.repeats)
    print(render(rows))
    write_json(args.json, {"machine": machine_info(), "rows": rows}, log)
    png = args.json.with_suffix(".png")
    plot(rows, png)
    log.info("plot in %s", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
