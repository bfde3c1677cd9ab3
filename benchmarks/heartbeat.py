"""How long a silent place takes to be declared dead, for heartbeat settings.

    python -m benchmarks.heartbeat [--repeats R] [--json FILE] [--quick]

For each ``APGAS_HEARTBEAT`` setting, R times: a program on 3 places starts a
finish with a long task at place 2, and the place is stopped (SIGSTOP, which
looks to the others like a hung process or a host cut off the network);
measured is the time from the stop until the finish raises
``DeadPlaceError``. Detection should come after ``timeout`` and before
``interval + timeout`` seconds. Where the virtual cluster of the tests can
run (``tests/vcluster.py``: root, network namespaces), the same is measured
for a host cut off the network: place 0 on ``vh1``, places over ssh on
``vh2``..``vh4``, and the link of ``vh4`` taken down (``--link`` setting,
default ``0.5:3``). Nothing is asserted.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from benchmarks._common import median, percentile, run_probe, tagged_results
from benchmarks._harness import Column, Run, Table, harness, show

log = logging.getLogger("benchmarks.heartbeat")
ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ["0.2:1", "0.5:3", "1:10"]

PROBE = '''
import json, os, signal, threading, time
import apgas

def main():
    pid = apgas.at(apgas.place(2), os.getpid)
    stopped = []
    def stop():
        time.sleep(0.2)
        os.kill(pid, signal.SIGSTOP)
        stopped.append(time.monotonic())
    threading.Thread(target=stop).start()
    try:
        with apgas.finish():
            apgas.async_at(apgas.place(2), time.sleep, 120)
    except apgas.MultipleException as e:
        dead = [x for x in e.exceptions if isinstance(x, apgas.DeadPlaceError)]
        return {"detected": time.monotonic() - stopped[0], "ok": len(dead) == 1}
    return {"ok": False}

print("PROBE " + json.dumps(apgas.run(main, places=3)), flush=True)
'''


def _link_cut(setting: str, repeats: int, work: Path) -> list[float] | str:
    """Detection times of a cut link in the virtual cluster, or why it cannot run."""
    import shlex
    import subprocess
    import time

    sys.path.insert(0, str(ROOT / "tests"))
    from vcluster import VirtualClusterUnavailable, start_vcluster

    try:
        vc = start_vcluster(work, hosts=4, slurm=False)
    except (VirtualClusterUnavailable, RuntimeError, OSError) as e:
        return f"skipped: {e}"
    times = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("APGAS_")}
        env.update(PYTHONUNBUFFERED="1", APGAS_LAUNCHER="ssh", APGAS_SSH=shlex.join(vc.ssh_command),
                   APGAS_HOSTS="vh1,vh2,vh3,vh4", APGAS_INTERFACE="*", APGAS_HEARTBEAT=setting,
                   APGAS_LOG_LEVEL="ERROR", MODE="fail")
        for _ in range(repeats):
            proc = vc.exec("vh1", [sys.executable, str(ROOT / "tests" / "cross_host_prog.py")],
                           cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
            if proc.stdout.readline().strip() != "RUNNING":
                raise RuntimeError(f"the program did not start: {proc.communicate()[1][-2000:]}")
            time.sleep(0.5)
            cut = time.monotonic()
            vc.link_down("vh4")
            found, _, err = tagged_results(proc, "RESULT ", 60)
            vc.link_up("vh4")
            if len(found) != 1 or [c["place"] for c in found[0]["caught"]] != [3]:
                raise RuntimeError(f"no DeadPlaceError for place 3: {found} {err[-2000:]}")
            times.append(found[0]["detected"] - cut)
            time.sleep(1.0)
    finally:
        vc.stop()
    return times


TABLE = Table([Column("APGAS_HEARTBEAT", 16, left=True), Column("interval", 9, "g", "s"),
               Column("timeout", 9, "g", "s"), Column("median", 9, ".2f", "s"), Column("p90", 9, ".2f", "s"),
               Column("max", 9, ".2f", "s")])


@harness("benchmarks.heartbeat", __doc__, Path("bench-results/heartbeat.json"),
         "one repeat, the first two settings")
def main(run: Run) -> int:
    args, report = run.args, run.report
    repeats = args.repeats or (1 if args.quick else 5)
    settings = SETTINGS[:2] if args.quick else SETTINGS
    report.update(repeats=repeats, settings={})
    probe = ["-c", PROBE]
    for setting in settings:
        env = {**os.environ, "APGAS_HEARTBEAT": setting, "APGAS_LOG_LEVEL": "ERROR"}
        times = [run_probe([sys.executable, *probe], env, ROOT, 120,
                           lambda p: p["ok"])["detected"] for _ in range(repeats)]
        interval, timeout = (float(x) for x in setting.split(":"))
        report["settings"][setting] = {"interval": interval, "timeout": timeout,
                                       "median": median(times), "max": max(times),
                                       "p90": percentile(times, 90), "samples": times}
        log.info("%s: median %.2f s", setting, median(times))
    link = "0.5:3"
    with tempfile.TemporaryDirectory(prefix="apgas-hb-", dir="/tmp") as tmp:
        cut = _link_cut(link, repeats, Path(tmp))
    report["link_cut"] = {"setting": link, **({"skipped": cut} if isinstance(cut, str) else
                          {"median": median(cut), "max": max(cut), "samples": cut})}
    show("\n" + TABLE.render([setting, *(row[k] for k in ("interval", "timeout", "median", "p90", "max"))]
                             for setting, row in report["settings"].items()))
    row = report["link_cut"]
    if "skipped" in row:
        show(f"link cut ({link}): {row['skipped']}")
    else:
        show(f"link cut in the virtual cluster ({link}): median {row['median']:.2f} s, "
             f"max {row['max']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
