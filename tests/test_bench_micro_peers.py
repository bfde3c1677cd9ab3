"""The peers of ``benchmarks.micro`` at their smallest (issue 54): the socketpair floor,
Charm4py (skipped, and said so, when it cannot run) and the table of ratios to the floor."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from benchmarks import _charm_peers, _socketpair_floor


@pytest.mark.timeout(60)
def test_the_socketpair_floor_at_a_tiny_size():
    with _socketpair_floor.SocketpairEcho() as echo:
        times = echo.round_trips(50)
        proc = echo._proc
    assert proc.poll() is not None          # the echo ended when its end was closed
    assert len(times) == 50 and all(t > 0 for t in times)
    samples: dict[str, list[float]] = {}
    _socketpair_floor.floor_samples(samples, times)
    _socketpair_floor.floor_samples(samples, _socketpair_floor.round_trips(50, warmup=5))
    assert len(samples["socketpair_median_us"]) == 2
    assert all(0 < m <= p for m, p in zip(samples["socketpair_median_us"], samples["socketpair_p99_us"], strict=True))


@pytest.mark.timeout(60)
def test_charm4py_is_skipped_with_a_reason_when_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "charm4py", None)    # import charm4py now raises ImportError
    result = _charm_peers.run_program(10, 20, 1, timeout=10)
    assert result["skipped"].startswith("skipped: charm4py is not importable")
    charm = _charm_peers.MicroCharm(1)
    samples: dict[str, list[float]] = {}
    charm.repeat(10, 20, samples)
    assert charm.skipped and samples == {}
    summary = _socketpair_floor.peers_summary({"socketpair_median_us": [10.0], "socketpair_p99_us": [20.0],
                                               "rtt_median_us": [25.0], "rtt_p99_us": [900.0]},
                                              {"charm": charm.skipped, "ray": None})
    table = _socketpair_floor.render_peers(summary)
    assert "Charm4py ret=True call, PE 0 -> 1" in table and charm.skipped in table
    goals = {g["goal"]: g for g in summary["goals"]}
    assert goals["at() median / socketpair floor median"]["value"] == pytest.approx(2.5)
    assert goals["at() median / socketpair floor median"]["met"] is True
    assert goals["at() median / Charm4py median"]["met"] is None     # nothing to compare with
    assert goals["at() p99"]["met"] is True
    assert goals["finish over no-op tasks, 2 places"]["met"] is None


@pytest.mark.timeout(60)
@pytest.mark.skipif(importlib.util.find_spec("charm4py") is None, reason="charm4py is not installed (bench extra)")
def test_charm4py_round_trips_and_tasks_at_a_tiny_size(monkeypatch):
    started = []
    popen = _charm_peers.subprocess.Popen

    def recorded(*args, **kwargs):
        started.append(proc := popen(*args, **kwargs))
        return proc

    monkeypatch.setattr(_charm_peers.subprocess, "Popen", recorded)
    result = _charm_peers.run_program(20, 100, 2, timeout=50)
    assert result["skipped"] is None, result
    assert result["calls"] == 20 and result["tasks"] == 100 and result["tasks_s"] > 0
    samples: dict[str, list[float]] = {}
    _charm_peers.add_samples(samples, result)
    assert 0 < samples["charm_median_us"][0] <= samples["charm_p99_us"][0]
    [proc] = started
    assert _charm_peers.group_members(proc.pid) == []       # charmrun and both PEs ended
