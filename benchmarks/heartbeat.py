"""How long a silent place takes to be declared dead, for heartbeat settings.

    python -m benchmarks.heartbeat [--repeats R] [--json FILE] [--quick]

For each ``APGAS_HEARTBEAT`` setting, R times: a program on 3 places starts a
finish with a long task at place 2, and the place is stopped (SIGSTOP, which
looks to the others like a hung process or a host cut off the network);
measured is the time from the stop until the finish raises
``DeadPlaceError``. Detection should come after ``timeout`` and before
``interval + timeout`` seconds. Nothing is asserted.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import (machine_info, median, parse_args, percentile, run_probe,
                                setup_logging, write_json)

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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "python -m benchmarks.heartbeat", __doc__,
                      Path("bench-results/heartbeat.json"), "one repeat, the first two settings")
    repeats = args.repeats or (1 if args.quick else 5)
    settings = SETTINGS[:2] if args.quick else SETTINGS
    setup_logging("benchmarks")
    report: dict[str, Any] = {"machine": machine_info(), "repeats": repeats, "settings": {}}
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
    print(f"\n{'APGAS_HEARTBEAT':<16}{'interval':>9}{'timeout':>9}{'median':>9}{'p90':>9}{'max':>9}")
    for setting, row in report["settings"].items():
        print(f"{setting:<16}{row['interval']:>8g}s{row['timeout']:>8g}s{row['median']:>8.2f}s"
              f"{row['p90']:>8.2f}s{row['max']:>8.2f}s")
    write_json(args.json, report, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
