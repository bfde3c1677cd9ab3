"""What the harnesses promise a newcomer: a missing extra is named before anything is
measured, --quick is quick, slow parts are asked for, and nothing lands in
docs/results/ unless asked."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmarks import _common, balancing, dashboard, jobbatch, micro, simspeed

ROOT = Path(__file__).resolve().parent.parent


def test_a_harness_without_its_extra_says_which_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the bench extra were missing
    with pytest.raises(SystemExit) as ended:
        micro.main(["--quick", "--json", str(tmp_path / "m.json")])
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip() == (
        'benchmarks.micro needs distributed (the bench extra): .venv/bin/pip install -e ".[bench]"')
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(SystemExit) as ended:  # --help still works without it
        micro.main(["--help"])
    assert ended.value.code == 0
    assert _common.install_hint(["numba", "tqdm", "mpi4py"]) == (
        'numba (the apps extra), tqdm (the bench extra), mpi4py (the mpi extra): '
        '.venv/bin/pip install -e ".[apps,bench,mpi]"')
    assert _common.missing("sys", "no_such_module_here") == ["no_such_module_here"]


def test_jobbatch_quick_runs_the_smaller_jobs():
    args = jobbatch.parse(["--quick"])
    assert (args.jobs, args.shares, args.spread) == (5, [0, 100], 6.0)
    assert [c.name for c in jobbatch.QUICK_TABLE] == ["uts-12", "nq-15", "bc-12", "pi-5e9"]
    batch = jobbatch.make_batch(0, 40, 6.0, jobbatch.QUICK_TABLE)
    assert {j.config.name for j in batch.jobs} == {c.name for c in jobbatch.QUICK_TABLE}
    full = jobbatch.make_batch(0, 40, 6.0)  # the full table by default (benchmarks.dashboard)
    assert {j.config.name for j in full.jobs} - {c.name for c in jobbatch.QUICK_TABLE}


def test_simspeed_times_the_real_traces_only_when_asked(monkeypatch, tmp_path, capsys):
    ran: list[str] = []
    monkeypatch.setattr(simspeed, "synthetic", lambda ns: ran.append("synthetic"))
    monkeypatch.setattr(simspeed, "trace_speed", lambda *a: ran.append("traces") or [])
    assert simspeed.main(["--traces", str(tmp_path)]) == 0
    assert ran == ["synthetic"]
    assert simspeed.main(["--real-traces", "--skip-synthetic", "--traces", str(tmp_path),
                          "--traces-json", str(tmp_path / "t.json")]) == 0
    assert ran == ["synthetic", "traces"]
    with pytest.raises(SystemExit) as ended:
        simspeed.main(["--skip-synthetic"])
    assert ended.value.code == 2 and "without --real-traces" in capsys.readouterr().err


def test_screenshots_need_the_run_with_one_page(capsys):
    with pytest.raises(SystemExit):
        dashboard.parse(["--screenshots", "shots", "--pages", "0,4"])
    assert "include 1 in --pages" in capsys.readouterr().err
    assert dashboard.parse(["--screenshots", "shots", "--quick"]).pages == [0, 1, 4]


def test_nothing_goes_to_docs_results_unless_asked():
    assert balancing.parse_args(["--quick"]).json == Path("bench-results/balancing.json")
    for path in sorted((ROOT / "benchmarks").glob("*.py")):  # no default path in docs/results
        assert not re.search(r"Path\(\s*[\"']docs/results", path.read_text()), path.name
