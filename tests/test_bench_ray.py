"""The Ray side of the benchmarks (``benchmarks._ray_peers``) at its smallest: exact
counts through Ray's tasks, the micro figures and their ratios, and no Ray process
left behind. Skipped where Ray is not installed (it is in the bench extra, not dev)."""

from __future__ import annotations

import contextlib
import os

import pytest

from benchmarks import _ray_peers, balancing, micro, peers
from glb.apps import pi, synthetic, uts

try:
    import ray
except ImportError:  # a mark, not a skip at collection: a run that selects other tests reports nothing
    ray = None

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(ray is None, reason="Ray is not installed; it is in the bench extra: "
                                 ".venv/bin/pip install -e \".[bench]\"")]

SMALL = {"seed": 19, "depth": 6}


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert not ray.is_initialized()
    assert _ray_peers.ray_processes() == []


def test_the_micro_figures_and_their_ratios():
    ready_s, total_s = _ray_peers.startup_once(4)          # 4 actors answered from 4 processes
    assert 0 < ready_s < total_s
    samples: dict[str, list[float]] = {}
    with _ray_peers.MicroRay(4, 5) as session:
        session.repeat(20, 40, samples)
        assert ray.is_initialized()
    assert set(samples) == {"ray_actor_median_us", "ray_actor_p99_us", "ray_task_median_us", "ray_task_p99_us",
                            "ray2_tasks_s", "ray4_tasks_s"}
    assert all(v[0] > 0 for v in samples.values())
    samples.update({"rtt_median_us": [100.0], "rtt_p99_us": [200.0], "batch_tasks_s": [1000.0],
                    "ray_startup_first_task_s": [ready_s], "startup_first_task_s": [0.5]})
    summary = _ray_peers.micro_summary(samples, 4)
    assert summary["skipped"] is None
    first = summary["rows"][0]
    assert first["ray_key"] == "ray_actor_median_us" and first["reference_key"] == "rtt_median_us"
    assert first["ray_over_reference"] == pytest.approx(samples["ray_actor_median_us"][0] / 100.0)
    startup = next(r for r in summary["rows"] if r["ray_key"] == "ray_startup_first_task_s")
    assert startup["ray_over_reference"] == pytest.approx(ready_s / 0.5)
    assert next(r for r in summary["rows"] if r["reference_key"] == "pool2_tasks_s")["ray_over_reference"] is None
    table = _ray_peers.render_micro(summary)
    assert "actor method round trip, median" in table and "x" in table.splitlines()[2]


def test_skipped_without_ray(monkeypatch):
    monkeypatch.setattr(_ray_peers, "SKIPPED", "skipped: ray is not importable (test)")
    assert _ray_peers.startup_samples(3, 4) == {}
    samples: dict[str, list[float]] = {}
    with _ray_peers.MicroRay(4, 5) as session:
        session.repeat(10, 10, samples)
    assert samples == {}
    summary = _ray_peers.micro_summary({"rtt_median_us": [100.0]}, micro.PLACES)
    assert summary["skipped"] and all(r["ray_over_reference"] is None for r in summary["rows"])
    assert "Ray rows skipped: ray is not importable (test)" in _ray_peers.render_micro(summary)
    with pytest.raises(RuntimeError, match="not importable"):
        with _ray_peers.local_ray(1):
            pass


def test_uts_through_ray_tasks_counts_the_trees_exactly():
    rows = _ray_peers.peer_runs(peers, "uts", {"tree": "T3"}, (2, 5), 2)
    assert [(system, kind) for system, kind, *_ in rows] == [
        ("Ray (2 static pieces)", "static"), ("Ray (5 static pieces)", "static"), ("Ray, dynamic", "dynamic")]
    assert all(result.nodes == uts.PUBLISHED["T3"] for _, _, _, result, _ in rows)
    assert rows[-1][4]["tasks"] > 1
    # a cutoff far below the tree's size: many generations of tasks, still exact
    small = _ray_peers.peer_runs(peers, "uts", SMALL, (), 2, cutoff=50, fanout=3)
    [(_, _, _, result, extra)] = small
    assert result.nodes == uts.sequential(SMALL).nodes and extra["tasks"] > 10


def test_pi_through_ray_tasks():
    params = {"samples": 2_000_000, "chunk": 1 << 14, "seed": 0}
    rows = _ray_peers.peer_runs(peers, "pi", params, (2, 16), 2)
    assert [system for system, *_ in rows] == ["Ray (2 static pieces)", "Ray (16 static pieces)"]
    for _, _, seconds, result, _ in rows:
        assert seconds > 0 and result.samples == params["samples"]
        assert result.hits == pi.sequential(params).hits and pi.check(params, result.estimate())


def test_the_sleeping_tree_through_ray_tasks():
    params = {**balancing.QUICK_TREE, "unit_ms": 0.01}
    seconds, nodes, tasks = _ray_peers.balancing_run(balancing, params, 3, balancing.CUTOFF, balancing.FANOUT, 120)
    assert nodes == synthetic.node_count(params) and tasks > 1 and seconds > 0


def test_peers_measures_ray_beside_the_others(monkeypatch):
    monkeypatch.setattr(peers, "with_cli", lambda app, args: {"seconds": 1.0, "result": 0, "correct": True})
    rows = peers.measure("uts", "uts", ["--seed", "19", "--depth", "6"], dask=False)
    ray_rows = [r for r in rows if r["system"].startswith("Ray")]
    assert [r["kind"] for r in ray_rows] == ["static", "static", "dynamic"]
    assert all(r["correct"] is None and r["result"] == uts.sequential(SMALL).nodes for r in ray_rows)
    summary = peers.summarize(rows)
    assert summary[0]["best_dynamic"] == "Ray, dynamic"
    assert "Ray, dynamic" in peers.render(rows, summary)


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets that ``pids`` listen on, from /proc."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):                # a worker may be gone by now
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if (link := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:["):
                        inodes.add(link[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:   # LISTEN
                out.append(fields[1])
    return out


def _loopback(hex_address: str) -> bool:
    host = hex_address.split(":")[0]
    if len(host) == 8:                                    # IPv4, little-endian
        return host == "0100007F"
    return host in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def test_no_ray_process_survives_a_failure_and_ray_listens_on_the_loopback_alone():
    with pytest.raises(KeyError):
        with _ray_peers.local_ray(1):
            assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
            ray.get(_ray_peers.noop.remote())
            addresses = _listening({*_ray_peers.ray_processes(), os.getpid()})
            assert addresses and all(_loopback(a) for a in addresses), addresses
            raise KeyError("a harness failing with Ray up")
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
