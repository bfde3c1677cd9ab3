"""Metrics on small hand-computed event logs, the overlap check, the Gantt
chart and reading logs."""

from __future__ import annotations

import json

import pytest

from apgas_scheduler.metrics import compute_metrics, gantt, node_intervals, read_events

PNG = b"\x89PNG\r\n\x1a\n"


def ev(t: float, event: str, **fields) -> dict:
    return {"t": t, "event": event, **fields}


# Two nodes, two jobs: job 1 holds both from 2 to 6, hands n2 to job 2 (6-10)
# and keeps n1 until 12.
TWO_JOBS = [
    ev(0, "pool", nodes=["n1", "n2"]),
    ev(0, "submit", job=1, name="uts", **{"class": "malleable"}),
    ev(1, "submit", job=2, name="pi", **{"class": "rigid"}),
    ev(2, "start", job=1, nodes=["n1", "n2"]),
    ev(6, "shrink", job=1, nodes=["n2"], duration=0.5),
    ev(6, "start", job=2, nodes=["n2"]),
    ev(7, "heartbeat"),  # unknown kinds are ignored
    ev(10, "end", job=2, state="done", reason=""),
    ev(12, "end", job=1, state="done", reason=""),
]


def test_two_jobs_exact_metrics():
    m = compute_metrics(TWO_JOBS)
    assert m["makespan"] == 12.0
    # held: n1 2-12 (10) + n2 2-6 (4) + n2 6-10 (4) = 18 of 2 x 12
    assert m["utilization"] == pytest.approx(18 / 24)
    assert m["mean_wait"] == pytest.approx((2 + 5) / 2)
    assert m["mean_turnaround"] == pytest.approx((12 + 9) / 2)
    assert m["jobs"] == 2
    assert m["by_state"] == {"done": 2}
    assert (m["grows"], m["shrinks"]) == (0, 1)
    assert m["mean_grow_seconds"] is None
    assert m["mean_shrink_seconds"] == 0.5
    assert m["max_overlap_violations"] == 0


def test_node_intervals_of_two_jobs():
    assert node_intervals(TWO_JOBS) == {
        "n1": [(2.0, 12.0, 1)],
        "n2": [(2.0, 6.0, 1), (6.0, 10.0, 2)],
    }


def test_events_out_of_order_in_the_log_are_sorted_by_time():
    assert compute_metrics(list(reversed(TWO_JOBS)))["utilization"] == pytest.approx(0.75)


def test_growing_pool_integrates_capacity_over_time():
    events = [
        ev(0, "pool", nodes=["a"]),
        ev(0, "submit", job=1, name="x", **{"class": "malleable"}),
        ev(0, "start", job=1, nodes=["a"]),
        ev(5, "pool", nodes=["b", "a"]),  # "a" is not counted twice
        ev(5, "grow", job=1, nodes=["b"], duration=1.0),
        ev(8, "submit", job=2, name="y", **{"class": "rigid"}),
        ev(10, "end", job=1, state="done", reason=""),
        ev(10, "end", job=2, state="cancelled", reason="user"),
    ]
    m = compute_metrics(events)
    assert m["makespan"] == 10.0
    assert m["utilization"] == pytest.approx((10 + 5) / (1 * 5 + 2 * 5))
    assert m["mean_wait"] == 0.0
    assert m["mean_turnaround"] == pytest.approx((10 + 2) / 2)
    assert m["by_state"] == {"cancelled": 1, "done": 1}
    assert (m["grows"], m["mean_grow_seconds"]) == (1, 1.0)


def test_overlap_violation_detected():
    events = [
        ev(0, "pool", nodes=["n1", "n2"]),
        ev(0, "submit", job=1, name="a", **{"class": "rigid"}),
        ev(0, "submit", job=2, name="b", **{"class": "rigid"}),
        ev(0, "start", job=1, nodes=["n1"]),
        ev(1, "start", job=2, nodes=["n1", "n2"]),
        ev(3, "end", job=1, state="done", reason=""),
        ev(4, "end", job=2, state="failed", reason="exit 1"),
    ]
    m = compute_metrics(events)
    assert m["max_overlap_violations"] == 1
    assert node_intervals(events)["n1"] == [(0.0, 3.0, 1), (1.0, 4.0, 2)]


def test_node_still_held_is_closed_at_last_event():
    events = [
        ev(0, "pool", nodes=["n1"]),
        ev(0, "submit", job=1, name="a", **{"class": "rigid"}),
        ev(1, "start", job=1, nodes=["n1"]),
        ev(9, "submit", job=2, name="b", **{"class": "rigid"}),
    ]
    assert node_intervals(events) == {"n1": [(1.0, 9.0, 1)]}
    m = compute_metrics(events)
    assert m["makespan"] is None and m["utilization"] is None
    assert m["mean_turnaround"] is None and m["mean_wait"] == 1.0


def test_empty_log():
    m = compute_metrics([])
    assert m["jobs"] == 0 and m["makespan"] is None and m["max_overlap_violations"] == 0
    assert node_intervals([]) == {}


def test_read_events_round_trip_and_skips_blank_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in TWO_JOBS[:3]) + "\n")
    assert read_events(path) == TWO_JOBS[:3]


def test_read_events_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(TWO_JOBS[0]) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"events\.jsonl:3:"):
        read_events(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"events\.jsonl:1: .*object"):
        read_events(path)


def test_gantt_writes_png(tmp_path):
    path = tmp_path / "gantt.png"
    gantt(TWO_JOBS, path, title="two jobs")
    assert path.read_bytes().startswith(PNG)


def test_gantt_many_nodes_and_jobs_and_empty_log(tmp_path):
    nodes = [f"node{i:02d}" for i in range(16)]
    events = [ev(0, "pool", nodes=nodes)]
    for j in range(30):
        t = 10.0 * j
        mine = [nodes[(2 * j + k) % 16] for k in range(2)]
        events += [ev(t, "submit", job=j, name=f"job-{j}", **{"class": "rigid"}),
                   ev(t, "start", job=j, nodes=mine),
                   ev(t + 9.0, "end", job=j, state="done", reason="")]
    gantt(events, tmp_path / "many.png")
    assert (tmp_path / "many.png").read_bytes().startswith(PNG)
    gantt([], tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG)


def test_nodes_reserved_for_a_grow_count_from_the_reservation():
    events = [
        ev(0, "pool", nodes=["n1", "n2", "n3"]),
        ev(0, "submit", job=1, name="m", **{"class": "malleable"}),
        ev(0, "start", job=1, nodes=["n1"]),
        ev(2, "reserve", job=1, nodes=["n2", "n3"]),
        ev(3, "release", job=1, nodes=["n3"]),       # given back before the grow was logged
        ev(4, "grow", job=1, nodes=["n2"], duration=2.0),
        ev(5, "reserve", job=1, nodes=["n3"]),
        ev(6, "grow_failed", job=1, nodes=["n3"], reason="error"),
        ev(8, "end", job=1, state="done", reason=""),
    ]
    assert node_intervals(events) == {"n1": [(0.0, 8.0, 1)], "n2": [(2.0, 8.0, 1)],
                                      "n3": [(2.0, 3.0, 1), (5.0, 6.0, 1)]}
    m = compute_metrics(events)
    assert m["utilization"] == pytest.approx((8 + 6 + 1 + 1) / 24)
    assert (m["grows"], m["mean_grow_seconds"]) == (1, 2.0)
