"""This tree against an earlier commit, side by side in one run: the runtime's micro-benchmarks.

    python -m benchmarks.versus REV [--rounds 2] [--repeats 5] [--json FILE]

Checks REV out into a temporary git worktree and runs ``benchmarks.micro``'s
APGAS measurement (round trips, fire-and-forget throughput, a counted batch;
no Dask, no start-up) in a fresh process for each tree, alternating
``--rounds`` times so that the machine's noise falls on both. Each tree
measures with its own code, so REV must have ``benchmarks.micro`` (it has
since the first release). Prints before, after and the ratio per metric
(> 1: this tree is better) and writes JSON. The worktree is removed at the end.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import checked_out, fmt, run_in_tree
from benchmarks._harness import Column, Run, Table, compared, harness
from benchmarks.micro import METRICS

log = logging.getLogger("benchmarks.versus")
RUN_TIMEOUT_S = 1800

# Runs in the measured tree's own Python path: its apgas, its benchmarks.micro.
DRIVER = """
import json, sys
import apgas, benchmarks.micro as micro
samples, failures = micro.apgas_measure(micro.make_params(int(sys.argv[1]), False))
print(json.dumps({"apgas": apgas.__file__, "samples": samples, "failures": failures}))
"""


def compare(rev: str, rounds: int, repeats: int) -> dict[str, Any]:
    """Alternate the two trees ``rounds`` times; medians over every sample of each."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with checked_out([rev], "apgas-versus-") as trees:
        for r in range(rounds):
            for side, name in (("before", rev), ("after", "this tree")):
                log.info("round %d/%d: %s (%s)", r + 1, rounds, side, name)
                runs[side].append(run_in_tree(trees[name], DRIVER, [str(repeats)], RUN_TIMEOUT_S))
    rows = []
    for m in METRICS:
        pooled = {side: [v for run in runs[side] for v in run["samples"].get(m.key, [])]
                  for side in runs}
        if not pooled["before"] or not pooled["after"]:
            continue  # start-up metrics: not measured here
        before, after = (statistics.median(pooled[s]) for s in ("before", "after"))
        ratio = after / before if m.higher_is_better else before / after
        rows.append({"metric": m.key, "label": m.label, "unit": m.unit, "before": before,
                     "after": after, "ratio": ratio, "samples": pooled})
    failures = {side: sum(run["failures"] for run in runs[side]) for side in runs}
    return {"rev": rev, "rounds": rounds, "repeats": repeats, "rows": rows, "failures": failures}


def render(report: dict[str, Any]) -> str:
    table = Table([Column("metric", 40, left=True), Column(report["rev"][:12], 14, gap=" "),
                   Column("this tree", 14, gap=" "), Column("ratio", 7, ".3f", "x", gap=" ")], rule=True)
    lines = [table.render([r["label"], fmt(r["before"], r["unit"]), fmt(r["after"], r["unit"]), r["ratio"]]
                          for r in report["rows"])]
    lines += ["", f"medians over {report['rounds']} alternating run(s) of {report['repeats']} "
              "repeat(s) per tree; ratio > 1: this tree is better",
              f"failed measurement runs (retried): {report['failures']}"]
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rev", help="the commit to compare with (e.g. HEAD~3, a tag)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per tree")
    parser.add_argument("--repeats", type=int, default=5, help="repeats within one run")
    parser.add_argument("--json", type=Path, default=Path("bench-results/versus.json"))


def check(args: argparse.Namespace) -> str | None:
    if args.rounds < 1 or args.repeats < 1:
        return f"--rounds and --repeats must be at least 1, got {args.rounds}, {args.repeats}"
    return None


@harness("benchmarks.versus", __doc__, Path("bench-results/versus.json"), options=options, check=check,
         loggers=(log.name,))
def main(run: Run) -> int:
    args = run.args
    return compared(run, lambda: compare(args.rev, args.rounds, args.repeats), render)


if __name__ == "__main__":
    sys.exit(main())
