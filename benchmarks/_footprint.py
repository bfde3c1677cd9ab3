"""What a place costs, from 64 to 1,024 places: start time, descriptors, sockets, threads
and memory per place and at place 0, and the connections a GLB run opens (issue 32,
"Past 256 places"); ``python -m benchmarks.malleability --footprint``.

Each size starts one job (its own process group, forked places, ``THREADS`` worker
threads per place): ``apgas.run`` on N places, then one ``at`` from place 0 to
every place, whose answers (the places' pids) must all differ. The job says
ready; this harness then reads ``/proc`` of place 0 and of every place process:

* descriptors (``/proc/<pid>/fd``), of which TCP sockets (their inodes in
  ``/proc/net/tcp``) and eventfds (each ZeroMQ socket's mailbox is one, besides
  the context's two);
* threads (``Threads`` of ``/proc/<pid>/status``);
* RSS (``VmRSS``) and PSS (``Pss`` of ``/proc/<pid>/smaps_rollup``: shared pages
  counted in parts, so the PSS of all processes adds up to the run's memory).

Then a second job, with the UTS kernels preloaded in the fork template as
``glb.apps`` does, computes a small UTS tree with GLB (random steals and
lifelines), and its sockets are counted after it: a link opens at its
first message, so the TCP connections show how many pairs of places ever
talked, against n(n - 1) if every place had talked to every other. Figures are
reported, never asserted on; the job's process group is killed at the end and
what outlived it is reported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._places import descendants, end_group, place_processes

__all__ = ["SIZES", "THREADS", "measure_size", "measure", "render_table", "proc_sample", "tcp_inodes"]

log = logging.getLogger("benchmarks.footprint")

SIZES = (64, 128, 256, 512, 1024)
THREADS = 2              # worker threads per place, as glb.apps gives one GLB worker
UTS_DEPTH = 9            # 1,031,269 nodes: a second or two, yet steals everywhere
JOIN_TIMEOUT_S = 60      # APGAS_JOIN_TIMEOUT: between two joins, on a crowded machine
READY_TIMEOUT_S = 60.0   # launch to the ready line, plus 0.2 s per place
GLB_TIMEOUT_S = 300.0
EXIT_TIMEOUT_S = 60.0

JOB = textwrap.dedent("""\
    import json, os, sys, time
    T0 = time.monotonic()
    import apgas
    from glb import GLB, GLBConfig
    from glb.apps.uts.app import APP
    from glb.apps.uts.trees import tree_of


    def say(what, **fields):
        print("footprint " + json.dumps({"what": what, **fields}), flush=True)


    def main():
        ready = time.monotonic() - T0
        places = apgas.places()
        begin = time.monotonic()
        pids = [apgas.at(p, os.getpid) for p in places]
        say("ready", places=len(places), start_s=ready, at_all_s=time.monotonic() - begin,
            answers=len(pids), distinct=len(set(pids)))
        if sys.stdin.readline().strip() == "glb":
            params = tree_of({"depth": int(sys.argv[2])}).params()
            begin = time.monotonic()
            result = GLB(GLBConfig()).compute_dynamic(APP.make_bag(params), APP.make_result(params))
            say("glb", seconds=time.monotonic() - begin, nodes=APP.value(result),
                correct=APP.check(params, APP.value(result)))
            sys.stdin.readline()


    apgas.run(main, places=int(sys.argv[1]), threads=int(sys.argv[3]), preload=sys.argv[4])
""")


# -- reading /proc ----------------------------------------------------------------------------

def tcp_inodes() -> set[int]:
    """The inodes of every TCP socket of this network namespace."""
    inodes: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(name).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9:
                    inodes.add(int(fields[9]))
    return inodes


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _pss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def proc_sample(pid: int, tcp: set[int]) -> dict[str, float] | None:
    """Descriptors, TCP sockets, eventfds, threads, RSS and PSS (MiB) of one process;
    None if it is gone."""
    fds = tcp_fds = eventfds = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
        for name in names:
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{name}")
                fds += 1
                if target.startswith("socket:[") and int(target[8:-1]) in tcp:
                    tcp_fds += 1
                elif target == "anon_inode:[eventfd]":
                    eventfds += 1
        status = _status(pid)
    except OSError:
        return None
    pss = _pss_kib(pid)
    return {"fds": fds, "tcp": tcp_fds, "eventfds": eventfds, "threads": int(status["Threads"]),
            "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "pss_mib": (pss if pss is not None else 0) / 1024}


def _spread(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per metric: mean, min and max over the places."""
    if not samples:
        return {}
    return {key: {"mean": statistics.fmean(s[key] for s in samples),
                  "min": min(s[key] for s in samples), "max": max(s[key] for s in samples)}
            for key in samples[0]}


def sample_run(root: int) -> dict[str, Any]:
    """Place 0 (``root``), the places below it, the fork template and the totals."""
    tcp = tcp_inodes()
    place0 = proc_sample(root, tcp)
    places = [s for s in (proc_sample(pid, tcp) for pid in place_processes(root)) if s is not None]
    others = [pid for pid in descendants(root) if pid not in place_processes(root)]
    helpers = [s for s in (proc_sample(pid, tcp) for pid in others) if s is not None]
    everyone = [place0, *places, *helpers] if place0 else places + helpers
    # a connection between two local processes shows as a descriptor in each; one listener each
    connections = (sum(s["tcp"] for s in places) + (place0 or {}).get("tcp", 0)
                   - len(places) - 1) / 2
    return {"place0": place0, "per_place": _spread(places), "processes": len(places),
            "helpers_pss_mib": sum(s["pss_mib"] for s in helpers),
            "total_pss_mib": sum(s["pss_mib"] for s in everyone),
            "total_threads": sum(s["threads"] for s in everyone),
            "connections": connections}


# -- one size -------------------------------------------------------------------------------

class _Lines:
    """The job's ``footprint {json}`` lines, as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._proc = proc
        threading.Thread(target=self._read, name="footprint-stdout", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("footprint "):
                self._queue.put(json.loads(line[len("footprint "):]))
        self._queue.put(None)

    def take(self, what: str, timeout: float) -> dict[str, Any]:
        try:
            got = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the job sent no {what!r} line within {timeout:g} s") from None
        if got is None or got.get("what") != what:
            raise RuntimeError(f"expected the job's {what!r} line, got {got} (exit {self._proc.poll()})")
        return got


def _run_job(places: int, threads: int, depth: int | None) -> dict[str, Any]:
    """One job: ready, sampled; with ``depth``, the UTS kernels preloaded in the fork
    template and a GLB run, sampled again after it; stopped, its group ended."""
    env = dict(os.environ, APGAS_JOIN_TIMEOUT=str(JOIN_TIMEOUT_S), APGAS_START_METHOD="fork")
    preload = "glb.apps.uts:warm_up" if depth else ""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(places), str(depth or 0), str(threads),
                             preload], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    out: dict[str, Any] = {}
    try:
        lines = _Lines(proc)
        ready = lines.take("ready", READY_TIMEOUT_S + 0.2 * places)
        out.update(ready_wall_s=time.monotonic() - began, start_s=ready["start_s"],
                   at_all_s=ready["at_all_s"],
                   at_ok=ready["answers"] == places and ready["distinct"] == places)
        time.sleep(1.0)  # the table acknowledged, every place idle
        out["ready"] = sample_run(proc.pid)
        assert proc.stdin is not None
        if depth:
            proc.stdin.write("glb\n")
            proc.stdin.flush()
            done = lines.take("glb", GLB_TIMEOUT_S)
            out["glb"] = {k: done[k] for k in ("seconds", "nodes", "correct")}
            out["after_glb"] = sample_run(proc.pid)
        with contextlib.suppress(OSError):
            proc.stdin.write("stop\n")
            proc.stdin.close()
        out["exit_code"] = proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        left = end_group(proc)
        out["left_behind"] = len(left)
        if left:
            log.warning("%d process(es) of the %d-place job outlived it (killed)", len(left), places)
        if proc.stdout is not None:
            proc.stdout.close()
    return out


def measure_size(places: int, glb: bool = True, threads: int = THREADS,
                 depth: int = UTS_DEPTH) -> dict[str, Any]:
    """The runtime alone (start, ``at`` to all, footprint of idle places); then, with
    ``glb``, a second job with the UTS kernels preloaded that computes a tree."""
    row: dict[str, Any] = {"places": places, "threads_per_place": threads,
                           **_run_job(places, threads, None)}
    if glb:
        try:
            run = _run_job(places, threads, depth)
        except (TimeoutError, RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            log.warning("%d places: the GLB job failed: %s", places, e)
            row["glb_error"] = str(e)
            return row
        row["glb_job"] = {"start_s": run["start_s"], "ready": run["ready"], "glb": run["glb"],
                          "after_glb": run["after_glb"], "left_behind": run["left_behind"]}
        row["glb"], row["after_glb"] = run["glb"], run["after_glb"]
        row["left_behind"] += run["left_behind"]
    return row


def measure(sizes: tuple[int, ...] = SIZES, glb: bool = True) -> list[dict[str, Any]]:
    """One job per size, smallest first; a size that fails is reported and skipped."""
    rows = []
    for places in sizes:
        try:
            rows.append(measure_size(places, glb))
        except (TimeoutError, RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            log.warning("%d places failed: %s", places, e)
            rows.append({"places": places, "error": str(e)})
        log.info("%d places: %s", places, json.dumps(rows[-1].get("ready", rows[-1]))[:200])
    return rows


# -- report ---------------------------------------------------------------------------------

def _pp(row: dict[str, Any], part: str, key: str) -> str:
    figure = row[part]["per_place"].get(key)
    return "-" if figure is None else f"{figure['mean']:.1f}"


def render_table(rows: list[dict[str, Any]]) -> str:
    """Markdown, as docs/results.md shows it: per place (mean over the places) and place 0."""
    lines = ["| places | start | at() to all | fds | TCP | eventfds | threads | RSS MiB | PSS MiB "
             "| place 0: fds | TCP | eventfds | threads | RSS MiB | all PSS GiB | GLB s "
             "| connections after GLB (of n(n-1)) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['places']} | failed: {r['error'][:80]} |")
            continue
        zero = r["ready"]["place0"] or {}
        glb = r.get("glb")
        after = r.get("after_glb")
        n = r["places"]
        conn = (f"{after['connections']:.0f} ({after['connections'] / (n * (n - 1)):.1%}); "
                f"TCP per place {_pp(r, 'after_glb', 'tcp')}, max "
                f"{after['per_place']['tcp']['max']:.0f}") if after else "-"
        glb_cell = "-" if not glb else f"{glb['seconds']:.2f}{'' if glb['correct'] else ' (WRONG)'}"
        lines.append(
            f"| {n} | {r['start_s']:.2f} s | {r['at_all_s']:.2f} s"
            f"{'' if r['at_ok'] else ' (WRONG)'} | {_pp(r, 'ready', 'fds')} | {_pp(r, 'ready', 'tcp')} "
            f"| {_pp(r, 'ready', 'eventfds')} | {_pp(r, 'ready', 'threads')} "
            f"| {_pp(r, 'ready', 'rss_mib')} | {_pp(r, 'ready', 'pss_mib')} "
            f"| {zero.get('fds', 0):.0f} | {zero.get('tcp', 0):.0f} | {zero.get('eventfds', 0):.0f} "
            f"| {zero.get('threads', 0):.0f} | {zero.get('rss_mib', 0):.0f} "
            f"| {r['ready']['total_pss_mib'] / 1024:.2f} | {glb_cell} | {conn} |")
    lines += ["", f"forked places, {THREADS} worker threads each; start: apgas.run to main; per place: "
              "mean over the places; TCP: TCP sockets (a listener and one per connection end); "
              "eventfds: ZeroMQ sockets' mailboxes; all PSS: every process of the run; GLB: UTS "
              f"depth {UTS_DEPTH}, its connections counted after it",
              "left behind: " + ", ".join(f"{r['places']}: {r.get('left_behind', '?')}" for r in rows)]
    return "\n".join(lines)


def kill_on_signal() -> None:
    """SIGTERM ends the harness like Ctrl-C (jobs are ended in ``finally``)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
