"""Issue 56: the real ElastiSim, as ``.ci/install-services`` builds it, runs the Kassel
small input to the end under a Kassel strategy (rigid EASY backfilling).

It skips, saying why, where ElastiSim is not built (``tests/_elastisim.py``)."""

from __future__ import annotations

import csv
import json
import time

import pytest
from _elastisim import KASSEL, find, prepare_input, run_elastisim, run_strategy, stop

RUN_TIMEOUT = 60.0  # s: the small input takes about a second


@pytest.fixture
def elastisim():
    folder, reason = find()
    if folder is None:
        pytest.skip(reason)
    return folder


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_the_small_input_runs_to_the_end_under_rigid_easy_backfilling(elastisim, tmp_path):
    config = prepare_input(tmp_path, elastisim / KASSEL / "input_files" / "small")
    settings = json.loads(config.read_text())
    jobs = json.loads((tmp_path / "jobs.json").read_text())["jobs"]
    assert settings["zmq_url"].startswith("ipc://") and "/tmp/elastisim.ipc" not in settings["zmq_url"]

    simulator = run_elastisim(elastisim / "build" / "elastisim", config)
    strategy = None
    try:
        strategy = run_strategy(elastisim, "rigid_easy_backfill", config)
        deadline = time.monotonic() + RUN_TIMEOUT
        while simulator.poll() is None or strategy.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"no end after {RUN_TIMEOUT:.0f} s; ElastiSim: "
                            f"{(tmp_path / 'elastisim.log').read_text()[-2000:]!r}; strategy: "
                            f"{(tmp_path / 'rigid_easy_backfill.log').read_text()[-2000:]!r}")
            if strategy.poll() not in (None, 0) or simulator.poll() not in (None, 0):
                break  # one failed: the other would wait for it forever
            time.sleep(0.05)
        logs = (f"ElastiSim ({simulator.poll()}): {(tmp_path / 'elastisim.log').read_text()[-2000:]}\n"
                f"strategy ({strategy.poll()}): {(tmp_path / 'rigid_easy_backfill.log').read_text()[-2000:]}")
        assert simulator.returncode == 0 and strategy.returncode == 0, logs
    finally:
        for process in (strategy, simulator):
            if process is not None:
                stop(process)

    with open(settings["job_statistics"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(row["ID"]) for row in rows) == list(range(len(jobs)))
    assert {row["Status"] for row in rows} == {"completed"}
    for row in rows:
        job = jobs[int(row["ID"])]
        assert row["Type"] == job["type"].lower()
        assert float(row["Submit Time"]) == job["submit_time"]
        assert float(row["Submit Time"]) <= float(row["Start Time"]) < float(row["End Time"])
    # the strategy ran in tmp_path and logged a start for every job there
    with open(tmp_path / "output" / "event.csv", newline="") as f:
        events = list(csv.DictReader(f))
    assert sorted(e["Jobs"] for e in events if e["Event"] == "START") == sorted(f"J{i}" for i in range(len(jobs)))
