"""Resilient GLB: what the backups cost without failures, and what a lost place costs.

    python -m benchmarks.resilience [--repeats 5] [--places 4,8] [--kills 0,1,2] [--trials 3]
        [--depth 14] [--seed 1] [--heartbeat 0.5:3] [--no-overhead] [--no-failures]
        [--json FILE] [--quick]

Every run is its own ``python -m glb.apps uts ... --json`` process (in its own
process group), and its record gives the result, ``correct`` and ``seconds``
(the computation alone, as place 0 timed it) and, resilient, the ``resilience``
counters (glb/_resilience.py: backups, pieces, places lost, restored, rounds,
recovery_s).

1. **Overhead without failures.** UTS ``--depth 13 --places 2 --workers 1``,
   plain and ``--resilient``, interleaved (plain, resilient, plain, ...)
   ``--repeats`` times so that the machine's noise falls on both. Reported:
   the best and the median of each, best(resilient) / best(plain) against the
   target 1.05 (at most 5% overhead; the median ratio beside it), and the
   backup traffic to place 0 per run: records written (``backups``) and their
   bytes, pieces registered and their bytes, and all those bytes per second of
   computation (medians over the resilient runs).

2. **Failures.** Resilient UTS ``--depth 14`` (about 13 s on the 2 shared
   cores, whatever the place count: the cores are the limit) on each of
   ``--places`` P (one worker a place; the *group* of the rows) with
   ``APGAS_HEARTBEAT`` set to ``--heartbeat`` (0.5:3) in the child's
   environment. Each of ``--trials`` rounds runs, in this order: 0 kills on
   P places, 0 kills on P - 1 and P - 2 places (the ideal's reference,
   below), then 1 and 2 places SIGKILLed on P places (the 0-kill runs
   first, so the kill moments can follow the no-failure time T0 measured
   so far). The benchmark finds the places from outside: the descendants
   of the ``glb.apps`` process (a walk of ``/proc``) that run
   ``apgas._serve`` and read their standard input from a pipe (place 0
   writes their bootstrap there). That excludes the fork template and its
   short-lived middle processes (stdin ``/dev/null``,
   launcher/_forkserver.py), and the ``glb.apps`` process itself, which is
   place 0 and is never a candidate. A forked place keeps the template's
   command line, so its place id is not visible from outside; it is taken
   afterwards from place 0's ``place N died`` warning. Once every place
   runs, the k kills fall at random moments (``random.Random(--seed)``)
   uniformly in 15%..75% of T0 after that, each on a random live place
   other than 0.

   Per run: whether the result is exact (the process exited 0, the record's
   ``correct`` is not false, and the result equals the reference: the
   published node count where there is one, else the node count of the
   sequential kernel, run once first; depth 14 has no published count, so
   its record says ``correct null`` and the sequential count decides), the
   seconds, the places lost per the record against the kills made, the
   finish rounds, place 0's recovery time, the cores other processes of the
   shared machine took meanwhile (``others``: the machine's busy CPU time
   from ``/proc/stat`` less the run's own, over its wall time), and the
   **time lost per failure** = (seconds - median seconds of the 0-kill runs
   on P places) / k.

   That time can be negative: on 2 cores, P places time-share the cores, and
   fewer places waste less on it (switching, more steals), so the work goes
   faster after a loss. Hence the *ideal* time lost per failure: the work
   going at the 0-kill pace of the places still alive (T0 on P, then on
   P - 1, ... places, from the median of the rows with fewer places, the
   kills at their moments), less T0 on P, per failure. The kill moments are
   counted from when all places ran, a little before the computation
   starts: an approximation. **excess** = (seconds - that ideal time) / k is
   then the price of resilience itself: noticing the death, place 0
   restoring the lost place's records and pieces, redoing the work done
   since its last backup (at most ``GLBConfig.backup_interval`` = 0.5 s of
   one worker's time), one more finish round when the first one missed the
   loss; and the noise of a shared machine, which medians of 3 only soften.

A wrong result, a failed run or a hang (no end within 10 x T0 + 120 s) in
either part is printed loudly and makes the exit status 1. Each run's process
group is killed when the run ends (and any member left behind is reported),
also on Ctrl-C or SIGTERM, so nothing is left running. Times are reported,
never asserted on.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import communicate_or_kill
from ._harness import Column, Run, Table, harness, show
from ._places import end_group, kill_leftovers, kill_places, track_group
from .scaling import busy_seconds, children_cpu

log = logging.getLogger("benchmarks.resilience")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = Path("bench-results/resilience.json")
TARGET = 1.05                      # best(resilient) / best(plain), without failures
OVERHEAD_DEPTH, OVERHEAD_PLACES = 13, 2
PLACES, QUICK_PLACES = (4, 8), (4,)
DEPTH, QUICK_DEPTH = 14, 13
KILL_WINDOW = (0.15, 0.75)         # kill moments, as fractions of T0 after all places run
DIED = re.compile(r"\[place 0\].*\bplace (\d+) died\b")

def run_uts(args: list[str], env: dict[str, str], timeout: float, kills: list[float] | None = None,
            places: int = 0, rng: random.Random | None = None) -> dict[str, Any]:
    """One ``python -m glb.apps uts ARGS --json`` in its own process group; with ``kills``
    (offsets in s after all ``places`` - 1 place processes run), SIGKILL a random live
    place other than 0 at each. The run's facts: exit code, record, kills, stderr's deaths."""
    with tempfile.TemporaryDirectory(prefix="apgas-resilience-") as tmp:
        out, err_path = Path(tmp) / "r.json", Path(tmp) / "err"
        cmd = [sys.executable, "-m", "glb.apps", "uts", *args, "--json", str(out)]
        with open(err_path, "w+b") as err:
            busy, own, began = busy_seconds(), children_cpu(), time.monotonic()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            track_group(proc.pid)
            killed: list[dict[str, Any]] = []
            hang, left = False, []
            try:
                if kills:
                    assert rng is not None
                    killed = kill_places(proc, places, kills, rng, began)
                communicate_or_kill(proc, max(1.0, timeout - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                hang = True
            finally:
                left = end_group(proc)
            wall = time.monotonic() - began
            now = busy_seconds()
            others = None if busy is None or now is None else \
                max(0.0, now - busy - (children_cpu() - own)) / wall
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        record = json.loads(out.read_text()) if out.exists() else None
    return {"command": cmd[1:], "exit": proc.returncode, "hang": hang, "record": record, "killed": killed,
            "died": sorted({int(m) for m in DIED.findall(stderr)}), "left_behind": left,
            "wall_s": wall, "others_cores": others, "stderr_tail": stderr[-3000:]}


# -- the two parts --------------------------------------------------------------------------------

def reference(depth: int, timeout: float) -> tuple[int, str]:
    """UTS's node count at ``depth`` and where it comes from."""
    from glb.apps.uts.trees import REFERENCE
    if depth in REFERENCE:
        return REFERENCE[depth], "published"
    log.info("no published node count for depth %d: counting it with the sequential kernel", depth)
    run = run_uts(["--depth", str(depth), "--sequential"], dict(os.environ), timeout)
    if run["exit"] != 0 or run["record"] is None:
        raise RuntimeError(f"the sequential count failed: {run['stderr_tail']}")
    return int(run["record"]["result"]), "sequential kernel"


def _verdict(run: dict[str, Any], expected: int) -> tuple[bool, str]:
    rec = run["record"]
    if run["hang"]:
        return False, "HANG"
    if run["exit"] != 0 or rec is None:
        return False, f"FAILED (exit {run['exit']})"
    if rec["correct"] is False or rec["result"] != expected:
        return False, f"WRONG RESULT {rec['result']} (expected {expected})"
    return True, ""


def overhead(repeats: int, env: dict[str, str]) -> dict[str, Any]:
    expected, _ = reference(OVERHEAD_DEPTH, 600)
    args = ["--depth", str(OVERHEAD_DEPTH), "--places", str(OVERHEAD_PLACES), "--workers", "1"]
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "resilient": []}
    for k in range(repeats):
        for mode in runs:   # interleaved: both see the same machine
            run = run_uts([*args, *(["--resilient"] if mode == "resilient" else [])], env, 300)
            run["ok"], run["problem"] = _verdict(run, expected)
            if run["ok"] and run["record"].get("correct") is not True:
                run["ok"], run["problem"] = False, "the record does not say correct true"
            runs[mode].append(_slim(run))
            rec = run["record"] or {}
            log.info("overhead %d/%d %-9s %s s %s", k + 1, repeats, mode,
                     f"{rec['seconds']:.3f}" if "seconds" in rec else "-", run["problem"] or "correct")
    return {"app_args": args, "expected": expected, "runs": runs, "summary": _overhead_summary(runs)}


def _overhead_summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    secs = {mode: [r["seconds"] for r in rs if r["ok"]] for mode, rs in runs.items()}
    out: dict[str, Any] = {}
    for mode, s in secs.items():
        out[mode] = {"best_s": min(s) if s else None, "median_s": statistics.median(s) if s else None}
    if all(secs.values()):
        out["ratio_best"] = out["resilient"]["best_s"] / out["plain"]["best_s"]
        out["ratio_median"] = out["resilient"]["median_s"] / out["plain"]["median_s"]
        out["target"] = TARGET
        out["met"] = out["ratio_best"] <= TARGET
    res = [r for r in runs["resilient"] if r["ok"] and r["resilience"]]
    if res:
        def med(key: str) -> float:
            return statistics.median(r["resilience"][key] for r in res)
        out["traffic"] = {key: med(key) for key in ("backups", "backup_bytes", "pieces", "piece_bytes")}
        out["traffic"]["bytes_per_s"] = statistics.median(
            (r["resilience"]["backup_bytes"] + r["resilience"]["piece_bytes"]) / r["seconds"] for r in res)
    return out


def failures(args: argparse.Namespace, env: dict[str, str], expected: int) -> list[dict[str, Any]]:
    """Each place count P: per trial, 0 kills on P places, then 0 kills on P - 1, ...,
    P - max(kills) places (the ideal's reference), then the runs with kills."""
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    fewer = range(1, max(args.kills) + 1)
    for group in args.places:
        plan = [(group, 0), *((group - j, 0) for j in fewer), *((group, k) for k in args.kills if k)]
        for trial in range(1, args.trials + 1):
            for places, k in plan:
                t0 = _t0(rows, group, group)   # the kill moments follow T0 measured so far
                if k and t0 is None:
                    log.warning("%d places: no 0-kill run succeeded, no T0: the kills are skipped", group)
                offsets = [rng.uniform(*KILL_WINDOW) * t0 for _ in range(k)] if t0 else None
                uts = ["--depth", str(args.depth), "--places", str(places), "--workers", "1", "--resilient"]
                run = run_uts(uts, env, 10 * (t0 or 30) + 120, offsets, places, rng)
                run["ok"], run["problem"] = _verdict(run, expected)
                row = {"group": group, "places": places, "kills": k, "trial": trial, **_slim(run)}
                rows.append(row)
                log.info("%d places, %d kill(s), trial %d: %s s, lost %s, died %s, others %s cores, %s",
                         places, k, trial, _f(row["seconds"]), (row["resilience"] or {}).get("places_lost"),
                         row["died"], _f(row["others_cores"], 2), row["problem"] or "exact")
                if not row["ok"]:
                    log.error("%d places, %d kill(s), trial %d (seed %d): %s; command: %s; stderr: %s",
                              places, k, trial, args.seed, row["problem"], " ".join(run["command"]),
                              run["stderr_tail"][-1500:])
    _time_lost(rows)
    return rows


def _t0(rows: list[dict[str, Any]], group: int, places: int) -> float | None:
    """The median seconds of the exact 0-kill runs on ``places`` places in ``group``."""
    secs = [r["seconds"] for r in rows
            if (r["group"], r["places"], r["kills"]) == (group, places, 0) and r["ok"]]
    return statistics.median(secs) if secs else None


def _slim(run: dict[str, Any]) -> dict[str, Any]:
    """What a run's row keeps: no whole record, the stderr tail only when it went wrong."""
    rec = run["record"] or {}
    row = {"ok": run["ok"], "problem": run["problem"], "exit": run["exit"], "result": rec.get("result"),
           "correct": rec.get("correct"), "seconds": rec.get("seconds"),
           "total_seconds": rec.get("total_seconds"), "final_places": rec.get("final_places"),
           "resilience": rec.get("resilience"), "killed": run["killed"], "died": run["died"],
           "wall_s": run["wall_s"], "others_cores": run["others_cores"], "left_behind": run["left_behind"]}
    if not run["ok"]:
        row["stderr_tail"] = run["stderr_tail"]
    return row


def ideal_seconds(t0: dict[int, float], places: int, kills: list[float]) -> float:
    """The time of the whole work when it goes at the no-failure pace of the places
    still alive: ``t0[n]`` s for all of it on n places, a place lost at each of
    ``kills`` (s from the start)."""
    done, t, live = 0.0, 0.0, places
    for at in sorted(kills):
        step = (at - t) / t0[live]
        if done + step >= 1.0:
            break
        done, t, live = done + step, at, live - 1
    return t + (1.0 - done) * t0[live]


def _time_lost(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        n, group = len(r["killed"]), r["group"]
        r["t0_median_s"] = _t0(rows, group, r["places"])
        r["lost_per_failure_s"] = r["ideal_lost_per_failure_s"] = r["excess_per_failure_s"] = None
        if not (n and r["ok"] and r["t0_median_s"] is not None and r["seconds"] is not None):
            continue
        t0 = r["t0_median_s"]
        r["lost_per_failure_s"] = (r["seconds"] - t0) / n
        paces = {p: _t0(rows, group, p) for p in range(group - n, group + 1)}
        if all(v is not None for v in paces.values()):
            ideal = ideal_seconds({p: v for p, v in paces.items() if v is not None}, group,
                                  [k["at_s"] for k in r["killed"]])
            r["ideal_lost_per_failure_s"] = (ideal - t0) / n
            r["excess_per_failure_s"] = (r["seconds"] - ideal) / n


def _failure_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key in dict.fromkeys((r["group"], r["places"], r["kills"]) for r in rows):
        mine = [r for r in rows if (r["group"], r["places"], r["kills"]) == key]
        good = [r for r in mine if r["ok"]]

        def med(field: str, rs: list[dict[str, Any]] = good) -> float | None:
            values = [r[field] for r in rs if r[field] is not None]
            return statistics.median(values) if values else None
        out.append({"group": key[0], "places": key[1], "kills": key[2], "runs": len(mine), "exact": len(good),
                    "median_s": med("seconds"), "median_lost_per_failure_s": med("lost_per_failure_s"),
                    "median_ideal_lost_per_failure_s": med("ideal_lost_per_failure_s"),
                    "median_excess_per_failure_s": med("excess_per_failure_s"),
                    "median_recovery_s": statistics.median(r["resilience"]["recovery_s"] for r in good)
                    if good else None,
                    "max_others_cores": max((r["others_cores"] for r in mine if r["others_cores"] is not None),
                                            default=None)})
    return out


# -- output ------------------------------------------------------------------------------------------

def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_overhead(part: dict[str, Any], repeats: int) -> str:
    s = part["summary"]
    lines = [f"Overhead without failures: UTS {' '.join(part['app_args'])}, plain and --resilient "
             f"interleaved, {repeats} runs each (computation seconds)",
             Table([Column("", 12, left=True), Column("best", 10), Column("median", 10)]).render(
                 [mode, f"{_f(s[mode]['best_s']):>8} s", f"{_f(s[mode]['median_s']):>8} s"]
                 for mode in ("plain", "resilient"))]
    if "ratio_best" in s:
        lines.append(f"resilient / plain: {s['ratio_best']:.3f} (best), {s['ratio_median']:.3f} (median); "
                     f"target best <= {TARGET} ({'met' if s['met'] else 'MISSED'})")
    if "traffic" in s:
        t = s["traffic"]
        lines.append(f"backup traffic to place 0 per run (medians): {t['backups']:.0f} records "
                     f"({t['backup_bytes']:,.0f} B), {t['pieces']:.0f} pieces ({t['piece_bytes']:,.0f} B); "
                     f"{t['bytes_per_s']:,.0f} B/s of computation")
    others = [r["others_cores"] for rs in part["runs"].values() for r in rs if r["others_cores"] is not None]
    if others:
        lines.append(f"other processes took {min(others):.2f} to {max(others):.2f} cores during the runs")
    bad = [r for rs in part["runs"].values() for r in rs if not r["ok"]]
    for r in bad:
        lines.append(f"!!! overhead run: {r['problem']}")
    return "\n".join(lines)


def render_failures(rows: list[dict[str, Any]], args: argparse.Namespace, expected: int, source: str) -> str:
    lines = [f"Failures: resilient UTS --depth {args.depth} (reference {expected:,} nodes, {source}), "
             f"1 worker a place, APGAS_HEARTBEAT={args.heartbeat}; places other than 0 SIGKILLed at "
             f"random moments, {KILL_WINDOW[0]:.0%}..{KILL_WINDOW[1]:.0%} of T0 after all places ran "
             f"(seed {args.seed})"]
    runs = Table([Column("group", 5), Column("places", 6, gap=" "), Column("kills", 5, gap=" "),
                  Column("trial", 5, gap=" "), Column("exact", 6, left=True, gap="  "), Column("seconds", 8),
                  Column("killed at s", 12, left=True, gap=" "), Column("lost", 5), Column("died", 6, left=True, gap=" "),
                  Column("rounds", 6), *(Column(t, w, gap=" ") for t, w in (
                      ("recovery", 9), ("lost/fail", 10), ("ideal", 7), ("excess", 7), ("others", 7)))])
    lines.append(runs.render(
        [r["group"], r["places"], r["kills"], r["trial"], r["ok"], _f(r["seconds"]),
         ",".join(f"{k['at_s']:.1f}" for k in r["killed"]) or "-", str((r["resilience"] or {}).get("places_lost", "-")),
         ",".join(map(str, r["died"])) or "-", str((r["resilience"] or {}).get("rounds", "-")),
         _f((r["resilience"] or {}).get("recovery_s")), _f(r["lost_per_failure_s"]), _f(r["ideal_lost_per_failure_s"]),
         _f(r["excess_per_failure_s"]), _f(r["others_cores"], 2)] for r in rows))
    lines.append("")
    medians = Table([Column("group", 5), Column("places", 6, gap=" "), Column("kills", 5, gap=" "),
                     Column("exact", 7, gap="  "), *(Column(t, w, gap=" ") for t, w in (
                         ("median s", 9), ("lost/fail", 10), ("ideal", 7), ("excess", 7), ("recovery", 9),
                         ("others max", 10))), Column("   (medians)", 0, left=True)])
    lines.append(medians.render(
        [s["group"], s["places"], s["kills"], f"{s['exact']:>3}/{s['runs']:<3}", _f(s["median_s"]),
         _f(s["median_lost_per_failure_s"]), _f(s["median_ideal_lost_per_failure_s"]),
         _f(s["median_excess_per_failure_s"]), _f(s["median_recovery_s"]), _f(s["max_others_cores"], 2)]
        for s in _failure_summary(rows)))
    lines += ["lost/fail = (seconds - median seconds of the 0-kill runs on the group's places) / kills;",
              "ideal = the same for the work going at the 0-kill pace of the places still alive (the rows",
              "with fewer places); excess = (seconds - ideal time) / kills: the price of resilience itself;",
              "others = cores other processes of the machine took during the run (on average)"]
    for r in rows:
        res = r["resilience"] or {}
        if not r["ok"]:
            lines.append(f"!!! {r['places']} places, {r['kills']} kill(s), trial {r['trial']}: {r['problem']}")
        elif res.get("places_lost") != len(r["killed"]):
            lines.append(f"note: {r['places']} places, {r['kills']} kill(s), trial {r['trial']}: "
                         f"{len(r['killed'])} killed, the record says {res.get('places_lost')} lost")
        if r["left_behind"]:
            lines.append(f"note: processes outlived the run and were killed: {r['left_behind']}")
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------------

def _counts(text: str) -> list[int] | None:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return None


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=None,
                        help="overhead runs of each mode (default 5; --quick 2)")
    parser.add_argument("--places", default=None, help=f"place counts of the failure runs (default "
                        f"{','.join(map(str, PLACES))}; --quick {','.join(map(str, QUICK_PLACES))})")
    parser.add_argument("--kills", default="0,1,2", help="places killed in a failure run (default %(default)s)")
    parser.add_argument("--trials", type=int, default=None,
                        help="failure runs of each place and kill count (default 3; --quick 1)")
    parser.add_argument("--depth", type=int, default=None,
                        help=f"UTS depth of the failure runs (default {DEPTH}; --quick {QUICK_DEPTH})")
    parser.add_argument("--seed", type=int, default=1, help="seeds the kill moments and victims")
    parser.add_argument("--heartbeat", default="0.5:3", help="APGAS_HEARTBEAT of the failure runs")
    parser.add_argument("--no-overhead", action="store_true", help="skip part 1")
    parser.add_argument("--no-failures", action="store_true", help="skip part 2")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="default: %(default)s")
    parser.add_argument("--quick", action="store_true",
                        help=f"2 overhead repeats, failures at depth {QUICK_DEPTH} on "
                             f"{','.join(map(str, QUICK_PLACES))} places, 1 trial: a smoke run (~1 min)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the defaults of the mode filled in."""
    args.repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    args.trials = args.trials if args.trials is not None else (1 if args.quick else 3)
    args.depth = args.depth if args.depth is not None else (QUICK_DEPTH if args.quick else DEPTH)
    for flag in ("--places", "--kills"):
        text = getattr(args, flag[2:])
        if text and _counts(text) is None:
            return f"{flag} takes comma-separated integers, got {text!r}"
    args.places = _counts(args.places) if args.places else list(QUICK_PLACES if args.quick else PLACES)
    args.kills = sorted(set(_counts(args.kills) or []) | {0})  # 0 kills: T0
    if args.repeats < 1 or args.trials < 1:
        return "--repeats and --trials must be at least 1"
    if not args.places or min(args.places) < 2:
        return "--places: place counts of at least 2"
    if min(args.kills) < 0 or max(args.kills) >= min(args.places):
        return "--kills: from 0 to fewer than the smallest place count (place 0 is never killed)"
    if not 1 <= args.depth <= 20:
        return "--depth: 1 to 20"
    return None


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@harness("benchmarks.resilience", __doc__, options=options, check=check,
         needs=lambda args: ["numba"], loggers=(log.name,), whole_doc=True)
def main(run: Run) -> int:
    args, report = run.args, run.report
    if not Path("/proc/self/stat").exists():
        print("benchmarks.resilience finds place processes in /proc: Linux only", file=sys.stderr)
        run.path = None
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupted)
    report.update({"command": run.command, "target": TARGET, "kill_window": KILL_WINDOW})
    ok = True
    try:
        if not args.no_overhead:
            part = overhead(args.repeats, dict(os.environ))
            report["overhead"] = part
            show("\n" + render_overhead(part, args.repeats))
            ok = all(r["ok"] for rs in part["runs"].values() for r in rs)
        if not args.no_failures:
            expected, source = reference(args.depth, 1200)
            env = {**os.environ, "APGAS_HEARTBEAT": args.heartbeat}
            rows = failures(args, env, expected)
            report["failures"] = {"depth": args.depth, "places": args.places, "kills": args.kills,
                                  "trials": args.trials, "seed": args.seed, "heartbeat": args.heartbeat,
                                  "expected": expected, "expected_from": source, "cores": os.cpu_count(),
                                  "runs": rows, "summary": _failure_summary(rows)}
            show("\n" + render_failures(rows, args, expected, source))
            ok = ok and all(r["ok"] for r in rows)
    except KeyboardInterrupt:
        kill_leftovers()
        print("interrupted: every run's process group was killed", file=sys.stderr)
        run.path = None
        return 130
    finally:
        kill_leftovers()
        signal.signal(signal.SIGTERM, previous)
    report["load_average_after"] = os.getloadavg()
    report["ok"] = ok
    if not ok:
        print("\n!!! RESILIENCE BENCHMARK: A RUN GAVE A WRONG RESULT, FAILED OR HUNG (see above) !!!",
              file=sys.stderr)
        return 1
    return 0


parse_args = main.parse


if __name__ == "__main__":
    sys.exit(main())
