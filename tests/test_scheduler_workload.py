"""Workloads for the simulator: SWF reading against hand-checked traces,
write/read round trips, the nesting of make_malleable, and the generators'
determinism and bounds.

``tests/data/sample_200.swf`` is produced by :func:`write_sample_200`; after an
intended change to ``kit_like`` regenerate it with
``python tests/test_scheduler_workload.py``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apgas_scheduler.sim.workload import (
    APGAS_TABLE,
    APGAS_WORK_UNIT,
    MEBF_INTENSIVE,
    RHO_CLASSES,
    SimJob,
    WorkloadError,
    apgas_job_batch,
    kit_like,
    make_malleable,
    read_swf,
    scale_arrivals,
    swf_header,
    uniform_evolving,
    write_swf,
)

DATA = Path(__file__).resolve().parent / "data"
SAMPLE = DATA / "sample_200.swf"
SAMPLE_ARGS = dict(seed=2024, jobs=200, nodes=64)


def rigid(id: int, submit: float, nodes: int, runtime: float, estimate: float) -> SimJob:
    return SimJob(id=id, submit=submit, cls="rigid", min_nodes=nodes, max_nodes=nodes,
                  preferred=nodes, runtime=runtime, estimate=estimate)


def rigid_view(job: SimJob) -> SimJob:
    """What survives an SWF round trip."""
    return rigid(job.id, job.submit, job.preferred, job.runtime, job.estimate)


def write_sample_200(path: Path = SAMPLE) -> None:
    write_swf(kit_like(**SAMPLE_ARGS), path,
              header=["Computer: synthetic KIT-like workload (scheduler.workload.kit_like)",
                      "Note: kit_like(seed=2024, jobs=200, nodes=64); written by "
                      "tests/test_scheduler_workload.py", "MaxNodes: 64", "MaxProcs: 64"])


# -- SWF reading ----------------------------------------------------------------------------

TINY = [
    rigid(1, 0.0, 8, 3600.0, 7200.0),
    rigid(2, 60.0, 4, 120.0, 600.0),       # requested processors unknown: allocated ones
    rigid(4, 200.0, 16, 900.0, 900.0),     # requested time unknown: estimate = run time
    rigid(5, 500.0, 2, 4000.0, 3600.0),    # estimate below the run time is kept
    rigid(7, 800.0, 5, 30.5, 60.0),
]


def test_tiny_trace_exact_jobs_and_stats():
    stats: dict[str, float] = {}
    assert read_swf(DATA / "tiny.swf", stats=stats) == TINY
    assert stats == {"jobs": 5, "skipped": 2, "first_submit": 1000.0}


@pytest.mark.parametrize("ppn, nodes", [(1, [8, 4, 16, 2, 5]), (4, [2, 1, 4, 1, 2]),
                                        (3, [3, 2, 6, 1, 2]), (16, [1, 1, 1, 1, 1])])
def test_procs_per_node_rounds_up(ppn, nodes):
    jobs = read_swf(DATA / "tiny.swf", procs_per_node=ppn)
    assert [j.preferred for j in jobs] == nodes
    assert all(j.min_nodes == j.max_nodes == j.preferred for j in jobs)


def test_max_jobs_counts_kept_jobs():
    stats: dict[str, float] = {}
    assert read_swf(DATA / "tiny.swf", max_jobs=3, stats=stats) == TINY[:3]
    assert stats["skipped"] == 1
    assert read_swf(DATA / "tiny.swf", max_jobs=0) == []


def test_header():
    header = swf_header(DATA / "tiny.swf")
    assert header["MaxNodes"] == "4" and header["MaxProcs"] == "16"
    assert header["Version"] == "2.2"


def test_bad_line_names_file_and_line():
    with pytest.raises(WorkloadError, match=r"bad_line\.swf:6: expected 18 fields, found 17") \
            as err:
        read_swf(DATA / "bad_line.swf")
    assert err.value.line == 6 and err.value.path.endswith("bad_line.swf")
    # the lines before it were fine
    assert len(read_swf(DATA / "bad_line.swf", max_jobs=2)) == 2


GOOD = "1 0 0 100 2 -1 -1 2 200 -1 1 1 1 1 1 1 -1 -1"


@pytest.mark.parametrize("bad, message", [
    ("2 10 0 abc 2 -1 -1 2 200 -1 1 1 1 1 1 1 -1 -1", "not a number"),
    ("2 10 0 nan 2 -1 -1 2 200 -1 1 1 1 1 1 1 -1 -1", "finite"),
    ("2.5 10 0 100 2 -1 -1 2 200 -1 1 1 1 1 1 1 -1 -1", "job number"),
    ("2 -1 0 100 2 -1 -1 2 200 -1 1 1 1 1 1 1 -1 -1", "submit time unknown"),
    (GOOD + " 7", "found 19"),
])
def test_malformed_lines(tmp_path, bad, message):
    path = tmp_path / "t.swf"
    path.write_text(f"; header\n{GOOD}\n\n{bad}\n")
    with pytest.raises(WorkloadError, match=rf"t\.swf:4: .*{message}"):
        read_swf(path)


def test_cancelled_job_with_unknown_submit_is_skipped_not_an_error(tmp_path):
    path = tmp_path / "t.swf"
    path.write_text(f"{GOOD}\n2 -1 -1 -1 2 -1 -1 2 200 -1 5 1 1 1 1 1 -1 -1\n")
    stats: dict[str, float] = {}
    assert len(read_swf(path, stats=stats)) == 1 and stats["skipped"] == 1


def test_unsorted_trace_is_sorted_and_made_relative(tmp_path):
    path = tmp_path / "t.swf"
    path.write_text("1 500 0 10 1 -1 -1 1 20 -1 1 1 1 1 1 1 -1 -1\n"
                    "2 300 0 10 1 -1 -1 1 20 -1 1 1 1 1 1 1 -1 -1\n")
    assert [(j.id, j.submit) for j in read_swf(path)] == [(2, 0.0), (1, 200.0)]


# -- writing --------------------------------------------------------------------------------

def test_round_trip_keeps_the_rigid_view(tmp_path):
    jobs = (apgas_job_batch(3, share=0.6) + uniform_evolving(3, jobs=5)
            + kit_like(3, 30, 64) + TINY)
    jobs = [rigid_view(j) for j in jobs]
    jobs = [rigid(i + 1, j.submit, j.preferred, j.runtime, j.estimate)
            for i, j in enumerate(sorted(jobs, key=lambda j: j.submit))]
    for ppn in (1, 4):
        path = tmp_path / f"rt{ppn}.swf"
        write_swf(jobs, path, header="Computer: test\nMaxNodes: 99", procs_per_node=ppn)
        assert read_swf(path, procs_per_node=ppn) == jobs
        assert swf_header(path)["MaxNodes"] == "99"


def test_round_trip_of_generated_non_rigid_jobs(tmp_path):
    jobs = make_malleable(kit_like(5, 50, 128), 0.5, seed=1) + uniform_evolving(5, jobs=3)
    jobs = [j for j in jobs if j.submit == 0] + [j for j in jobs if j.submit > 0]
    path = tmp_path / "g.swf"
    write_swf(jobs, path)
    back = {j.id: j for j in read_swf(path)}
    assert all(back[j.id] == rigid_view(j) for j in jobs[-3:])


def test_sample_200_trace():
    stats: dict[str, float] = {}
    jobs = read_swf(SAMPLE, stats=stats)
    assert stats == {"jobs": 200, "skipped": 0, "first_submit": 0.0}
    assert jobs == [rigid_view(j) for j in kit_like(**SAMPLE_ARGS)]
    assert swf_header(SAMPLE)["MaxNodes"] == "64"


def test_sample_200_is_what_its_generator_writes(tmp_path):
    write_sample_200(tmp_path / "s.swf")
    assert (tmp_path / "s.swf").read_text() == SAMPLE.read_text(), \
        "kit_like changed: regenerate with python tests/test_scheduler_workload.py"


# -- make_malleable -------------------------------------------------------------------------

sizes = st.lists(st.integers(1, 64), max_size=40)


def jobs_of(nodes: list[int]) -> list[SimJob]:
    return [rigid(i + 1, float(i), n, 100.0 + i, 200.0) for i, n in enumerate(nodes)]


@settings(max_examples=150, deadline=None)
@given(sizes, st.floats(0, 1), st.floats(0, 1), st.integers(0, 2**32),
       st.none() | st.integers(1, 200))
def test_make_malleable_nested_counted_and_bounded(nodes, a, b, seed, total):
    jobs = jobs_of(nodes)
    small, large = sorted((a, b))
    lo = make_malleable(jobs, small, seed, total_nodes=total)
    hi = make_malleable(jobs, large, seed, total_nodes=total)
    chosen = {j.id for j in lo if j.cls == "malleable"}
    assert chosen <= {j.id for j in hi if j.cls == "malleable"}
    assert len(chosen) == math.floor(small * len(jobs) + 0.5)
    for old, new in zip(jobs, hi, strict=True):
        if new.cls == "rigid":
            assert new == old
            continue
        p = old.preferred
        assert new.preferred == p and new.runtime == old.runtime and new.estimate == old.estimate
        assert new.min_nodes == max(1, p // 2)
        cap = 5 * p if total is None else min(5 * p, total)
        assert new.max_nodes == max(p, cap)
        assert new.min_nodes <= p <= new.max_nodes


@settings(max_examples=50, deadline=None)
@given(sizes, st.floats(0, 1), st.floats(0, 1), st.integers(0, 1000))
def test_make_malleable_rho_is_per_job_not_per_share(nodes, a, b, seed):
    jobs = jobs_of(nodes)
    x = make_malleable(jobs, a, seed, rho=RHO_CLASSES["medium"], serial=(0.0, 0.05))
    y = make_malleable(jobs, b, seed, rho=RHO_CLASSES["medium"], serial=(0.0, 0.05))
    assert [j.rho for j in x] == [j.rho for j in y]
    assert all(0.1 <= j.rho <= 0.2 and 0 <= j.serial <= 0.05 for j in x)


def test_make_malleable_options():
    jobs = jobs_of([4, 8, 10, 3])
    assert make_malleable(jobs, 0.0, 1) == jobs
    every = make_malleable(jobs, 1.0, 1, min_factor=0.25, max_factor=2.0, cls="moldable",
                           rho=0.3, total_nodes=16)
    assert [(j.cls, j.min_nodes, j.max_nodes, j.rho) for j in every] == [
        ("moldable", 1, 8, 0.3), ("moldable", 2, 16, 0.3), ("moldable", 2, 16, 0.3),
        ("moldable", 1, 6, 0.3)]
    many = jobs_of([2] * 40)
    assert make_malleable(many, 0.5, 7) == make_malleable(many, 0.5, 7)
    assert make_malleable(many, 0.5, 7) != make_malleable(many, 0.5, 8)
    for bad in (dict(cls="evolving"), dict(min_factor=0.0), dict(max_factor=0.5)):
        with pytest.raises(ValueError):
            make_malleable(jobs, 0.5, 1, **bad)
    with pytest.raises(ValueError):
        make_malleable(jobs, 1.5, 1)


def test_make_malleable_leaves_non_rigid_jobs_alone():
    jobs = uniform_evolving(1, jobs=4)
    assert make_malleable(jobs, 1.0, 1) == jobs


# -- scale_arrivals -------------------------------------------------------------------------

def test_scale_arrivals():
    scaled = scale_arrivals(TINY, MEBF_INTENSIVE)
    assert [j.submit for j in scaled] == [0.0, 45.0, 150.0, 375.0, 600.0]
    assert [j.submit for j in TINY] == [0.0, 60.0, 200.0, 500.0, 800.0]   # not changed
    assert all(a.runtime == b.runtime and a.id == b.id for a, b in zip(scaled, TINY, strict=True))
    assert scale_arrivals(TINY, 1.0) == TINY
    with pytest.raises(ValueError):
        scale_arrivals(TINY, 0.0)


# -- generators -----------------------------------------------------------------------------

def test_apgas_table_demand_is_8_node_hours_per_25_jobs():
    weights = sum(c.weight for c in APGAS_TABLE)
    mean = sum(c.weight * c.work * APGAS_WORK_UNIT for c in APGAS_TABLE) / weights
    assert 25 * mean == pytest.approx(8 * 3600)
    assert weights == 25 and len(APGAS_TABLE) == 25
    assert all(c.min_nodes <= c.nodes <= c.max_nodes <= 16 for c in APGAS_TABLE)
    demand = [sum(j.area for j in apgas_job_batch(s)) / 3600 for s in range(200)]
    assert statistics.mean(demand) == pytest.approx(8, rel=0.1)


def test_apgas_job_batch_shape():
    batch = apgas_job_batch(4)
    assert batch == apgas_job_batch(4) and batch != apgas_job_batch(5)
    assert [j.id for j in batch] == list(range(1, 26))
    assert [j.submit for j in batch[:5]] == [0.0] * 5
    submits = [j.submit for j in batch]
    assert submits == sorted(submits) and all(0 <= t < 600 for t in submits)
    rows = {(c.name, c.nodes): c for c in APGAS_TABLE}
    for j in batch:
        c = rows[(j.name, j.preferred)]
        assert j.cls == "rigid" and j.runtime == pytest.approx(c.work * APGAS_WORK_UNIT / c.nodes)
        assert j.estimate == j.runtime
    assert all(j.submit == 0 for j in apgas_job_batch(4, jobs=3))


def test_apgas_job_batch_malleable_shares_are_nested_with_table_ranges():
    rigid_batch = apgas_job_batch(9)
    previous: set[int] = set()
    for share in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        batch = apgas_job_batch(9, share=share, nodes=12)
        chosen = {j.id for j in batch if j.cls == "malleable"}
        assert len(chosen) == round(share * 25) and previous <= chosen
        previous = chosen
        rows = {(c.name, c.nodes): c for c in APGAS_TABLE}
        for j, r in zip(batch, rigid_batch, strict=True):
            assert (j.submit, j.preferred, j.runtime) == (r.submit, r.preferred, r.runtime)
            if j.cls == "malleable":
                c = rows[(j.name, j.preferred)]
                assert (j.min_nodes, j.max_nodes) == (c.min_nodes, max(c.nodes, min(12, c.max_nodes)))
    # the same subset as make_malleable with the same seed
    assert {j.id for j in apgas_job_batch(9, share=0.4) if j.cls == "malleable"} == \
        {j.id for j in make_malleable(rigid_batch, 0.4, 9) if j.cls == "malleable"}


def test_apgas_job_batch_rho_and_estimates():
    batch = apgas_job_batch(2, rho=0.1, estimate_factor=1.5)
    for j in batch:
        c = next(c for c in APGAS_TABLE if (c.name, c.nodes) == (j.name, j.preferred))
        assert j.runtime == pytest.approx(c.work * APGAS_WORK_UNIT / c.nodes ** 0.9)
        assert j.estimate == pytest.approx(1.5 * j.runtime) and j.rho == 0.1


@pytest.mark.parametrize("seed", range(5))
def test_uniform_evolving_bounds(seed):
    jobs = uniform_evolving(seed)
    assert jobs == uniform_evolving(seed)
    assert 15 <= len(jobs) <= 20 and all(j.submit == 0 for j in jobs)
    for j in jobs:
        assert j.cls == "evolving" and 1 <= len(j.profile) <= 10
        assert all(500 <= d <= 3600 and 1 <= n <= 75 for d, n in j.profile)
        sizes = [n for _, n in j.profile]
        assert (j.min_nodes, j.max_nodes, j.preferred) == (min(sizes), max(sizes), max(sizes))
        assert j.runtime == pytest.approx(sum(d for d, _ in j.profile)) == j.estimate
    small = uniform_evolving(seed, jobs=30, nodes=8, spread=100.0)
    assert len(small) == 30 and all(j.max_nodes <= 8 for j in small)
    assert all(0 <= j.submit < 100 for j in small)
    assert [j.submit for j in small] == sorted(j.submit for j in small)


def test_kit_like_bounds_and_load():
    jobs = kit_like(7, 2000, 500)
    assert jobs == kit_like(7, 2000, 500) and jobs != kit_like(8, 2000, 500)
    assert [j.id for j in jobs] == list(range(1, 2001))
    assert all(j.cls == "rigid" and 1 <= j.preferred <= 62 for j in jobs)
    assert all(60 <= j.runtime <= 72 * 3600 and j.runtime <= j.estimate <= 72 * 3600
               and j.runtime.is_integer() and j.submit.is_integer() for j in jobs)
    assert 0.25 < sum(j.preferred == 1 for j in jobs) / len(jobs) < 0.42
    load = sum(j.area for j in jobs) / (500 * jobs[-1].submit)
    assert load == pytest.approx(0.9, rel=0.1)
    heavier = scale_arrivals(jobs, MEBF_INTENSIVE)
    assert sum(j.area for j in heavier) / (500 * heavier[-1].submit) == pytest.approx(load / 0.75)


def test_generators_reject_bad_arguments():
    for call in (lambda: apgas_job_batch(1, cls="rigid"), lambda: apgas_job_batch(1, jobs=-1),
                 lambda: uniform_evolving(1, steps=(3, 2)), lambda: kit_like(1, 10, 0),
                 lambda: kit_like(1, 10, 8, max_size=9)):
        with pytest.raises(ValueError):
            call()


def test_simjob_validation():
    with pytest.raises(ValueError):
        rigid(1, 0.0, 0, 10.0, 10.0)
    with pytest.raises(ValueError):
        SimJob(1, 0.0, "rigid", 1, 2, 2, 10.0, 10.0)
    with pytest.raises(ValueError):
        SimJob(1, 0.0, "malleable", 2, 4, 1, 10.0, 10.0)
    with pytest.raises(ValueError):
        SimJob(1, 0.0, "evolving", 1, 2, 2, 10.0, 10.0)
    with pytest.raises(ValueError):
        SimJob(1, 0.0, "evolving", 1, 3, 3, 10.0, 10.0, profile=((5.0, 1), (5.0, 2)))
    with pytest.raises(ValueError):
        SimJob(1, 0.0, "gaseous", 1, 1, 1, 10.0, 10.0)
    assert rigid(1, 0.0, 3, 10.0, 5.0).area == 30.0


if __name__ == "__main__":
    write_sample_200()
    print(f"wrote {SAMPLE}")
