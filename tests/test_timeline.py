"""The run timeline (APGAS_TIMELINE): what a malleable GLB run writes, the reader,
the view model, and ``python -m apgas timeline``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from glb_bags import Count, TreeBag, tree_nodes
from orders import orders_then_gate

import apgas
from apgas import ConfigError
from apgas._core.config import load_config
from apgas._timeline.view import read_timeline, timeline_model
from glb import GLB, GLBConfig
from glb._sampling import Sampler

ROOT = Path(__file__).resolve().parent.parent


# -- a bag that notes whether its place samples load --------------------------------------------

def sampling_here() -> bool:
    return any(t.name.startswith("glb-sampler") for t in threading.enumerate())


class SpyCount(Count):
    def __init__(self, value: int = 0) -> None:
        super().__init__(value)
        self.sampled = False

    def fold(self, other: SpyCount) -> None:
        super().fold(other)
        self.sampled = self.sampled or other.sampled


class SpyBag(TreeBag):
    sampled = False

    def process(self, n: int) -> int:
        self.sampled = self.sampled or sampling_here()
        return super().process(n)

    def split(self, take_all: bool) -> SpyBag | None:
        piece = super().split(take_all)
        return None if piece is None else SpyBag(piece.nodes, piece.spin)

    def submit(self, result: SpyCount) -> None:
        super().submit(result)
        result.sampled = result.sampled or self.sampled


def by_kind(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


# -- a real run -------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_malleable_glb_run_writes_its_timeline(malleable_address, tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("APGAS_TIMELINE", str(path))
    monkeypatch.setenv("APGAS_TIMELINE_INTERVAL", "0.02")
    gate = str(tmp_path / "orders-done")
    roots = [(s, 18) for s in (4, 5, 6, 12)] + [(10, 18, gate)]  # the held root waits for the orders

    def main():
        client, replies = orders_then_gate(malleable_address, ("grow 1 a", "shrink 2"), gate)
        glb = GLB(GLBConfig(n=32, workers=2, malleable=True))
        total = glb.compute_dynamic(SpyBag(roots, spin=20), SpyCount())
        client.join(30)
        return total, glb.stats(), replies

    total, stats, replies = apgas.run(main, places=3, threads=3)
    assert replies[0] == ["ok grow 1 places 3"] and len(replies[1]) == 2, replies
    assert total.value == tree_nodes(roots) and total.sampled
    events = read_timeline(str(path))
    assert events[0]["event"] == "run" and events[0]["places"] == 3 and events[0]["pid"] == os.getpid()
    assert events[-1]["event"] == "end"

    joins = {e["place"]: e for e in by_kind(events, "join")}
    leaves = {e["place"]: e for e in by_kind(events, "leave")}
    assert sorted(joins) == sorted(leaves) == [0, 1, 2, 3]
    assert joins[3]["host"] == "a"
    assert {p: e["why"] for p, e in leaves.items()} == {0: "end", 1: "end", 2: "shrink", 3: "shrink"}
    assert all(joins[p]["t"] <= leaves[p]["t"] for p in joins)

    orders = by_kind(events, "order")
    assert [(o["order"], o["n"], o["places"]) for o in orders] == [("grow", 1, [3]), ("shrink", 2, [2, 3])]
    phases = [e for e in by_kind(events, "phase") if e.get("source") != "GLB"]
    for o in orders:
        mine = [p for p in phases if p["order"] == o["order"]]
        assert len(mine) == 3
        assert sum(p["seconds"] for p in mine) == pytest.approx(o["seconds"], abs=1e-3)
        assert all(o["start"] - 1e-3 <= p["start"] <= o["start"] + o["seconds"] + 1e-3 for p in mine)
    glb_phases = {e["phase"] for e in by_kind(events, "phase") if e.get("source") == "GLB"}
    assert glb_phases == {"preGrow", "postGrow", "preShrink", "postShrink"}

    loads: dict[int, list[dict]] = {}
    for e in sorted(by_kind(events, "load"), key=lambda e: e["t"]):
        loads.setdefault(e["place"], []).append(e)
    assert sorted(loads) == [0, 1, 2, 3]
    for place, samples in loads.items():
        counts = [s["processed"] for s in samples]
        assert counts == sorted(counts), f"place {place}: {counts}"
        assert counts[-1] == next(s.units for s in stats if s.place == place)
    assert sum(samples[-1]["processed"] for samples in loads.values()) == tree_nodes(roots)

    model = timeline_model(events)
    assert model["sections"][0]["rows"][3] == "place 3 (a)"
    assert [m["kind"] for m in model["sections"][0]["marks"]] == ["grow", "shrink"]
    assert dict(model["sections"][3]["items"])["items processed"] == tree_nodes(roots)


@pytest.mark.timeout(60)
def test_without_a_timeline_nothing_is_written_or_sampled(tmp_path, monkeypatch):
    monkeypatch.delenv("APGAS_TIMELINE", raising=False)
    monkeypatch.chdir(tmp_path)
    roots = [(4, 14), (5, 14)]

    def main():
        from apgas._timeline import recorder as _timeline

        assert _timeline.current() is None
        total = GLB(GLBConfig(n=32, workers=2)).compute_dynamic(SpyBag(roots), SpyCount())
        return total.value, total.sampled

    assert apgas.run(main, places=2, threads=3) == (tree_nodes(roots), False)
    assert list(tmp_path.iterdir()) == []


class FailingBag(TreeBag):
    """Raises at place 1: the computation fails there."""

    def process(self, n: int) -> int:
        if apgas.here().id == 1:
            raise RuntimeError("the bag failed")
        return super().process(n)

    def split(self, take_all: bool) -> FailingBag | None:
        piece = super().split(take_all)
        return None if piece is None else FailingBag(piece.nodes, piece.spin)


def glb_leftovers() -> tuple[int, bool]:
    from glb import _worker

    return len(_worker._states), sampling_here()


@pytest.mark.timeout(60)
def test_a_failed_computation_leaves_no_state_or_sampler_at_any_place(tmp_path, monkeypatch):
    monkeypatch.setenv("APGAS_TIMELINE", str(tmp_path / "run.jsonl"))
    monkeypatch.setenv("APGAS_TIMELINE_INTERVAL", "0.01")

    def main():
        with pytest.raises(apgas.MultipleException) as failed:  # static: place 1 has a bag
            GLB(GLBConfig(n=32, workers=2)).compute_static(
                lambda i, k: FailingBag([(4 + i, 16)], spin=5), Count())
        assert failed.group_contains(RuntimeError, match="the bag failed")
        time.sleep(0.05)  # a sampler ends at its next wake-up
        return [apgas.at(p, glb_leftovers) for p in apgas.places()]

    assert apgas.run(main, places=2, threads=3) == [(0, False), (0, False)]


@pytest.mark.timeout(60)
def test_a_place_that_dies_leaves_as_failed(tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("APGAS_TIMELINE", str(path))

    def main():
        apgas._core.runtime.current()._children[1].kill()
        deadline = time.monotonic() + 20
        while 1 in [p.id for p in apgas.places()] and time.monotonic() < deadline:
            time.sleep(0.02)

    apgas.run(main, places=2, threads=1)
    leaves = {e["place"]: e for e in by_kind(read_timeline(str(path)), "leave")}
    assert leaves[1]["why"] == "failed" and "exited" in leaves[1]["reason"]
    assert leaves[0]["why"] == "end"
    model = timeline_model(read_timeline(str(path)))
    assert [m["kind"] for m in model["sections"][0]["marks"]] == ["failed"]


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_bad_interval_is_a_clear_error(value):
    with pytest.raises(ConfigError, match=f"APGAS_TIMELINE_INTERVAL must be a positive number, "
                                          f"got '{value}'"):
        load_config({}, {"APGAS_TIMELINE_INTERVAL": value})
    assert load_config({}, {"APGAS_TIMELINE_INTERVAL": "0.5"}).timeline_interval == 0.5
    assert load_config({}, {}).timeline_interval == 0.1


def test_a_timeline_that_cannot_be_opened_stops_the_run_at_once(tmp_path):
    bad = tmp_path / "no-such-dir" / "t.jsonl"
    with pytest.raises(apgas.ApgasError, match="APGAS_TIMELINE: cannot open .*no-such-dir"):
        apgas.run(lambda: None, places=1, timeline=str(bad))


def test_a_sampler_keeps_at_most_its_limit():
    processed = iter(range(1000))
    sampler = Sampler(0.01, lambda: (next(processed), 1, 0), "test-sampler", limit=10)
    for _ in range(24):
        sampler.take()
    samples = sampler.stop()
    assert len(samples) <= 10
    counts = [s[1] for s in samples]
    assert counts == sorted(counts) and counts[-1] == 24  # the newest is kept: the last one taken
    assert sampler.interval == 0.08  # thinned three times
    sampler.take()
    assert sampler.stop() == samples  # stopped: no more samples


# -- the reader --------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, match", [
    ("{not json", r"x\.jsonl:3: not a JSON line"),
    ('[1, 2]', r"x\.jsonl:3: a timeline line must be a JSON object"),
    ('{"event": "join"}', r"x\.jsonl:3: the line has no 't'"),
    ('{"t": 1.0}', r"x\.jsonl:3: the line has no 'event'"),
    ('{"t": "soon", "event": "join"}', r"x\.jsonl:3: 't' must be a number"),
])
def test_the_reader_names_file_and_line(tmp_path, line, match):
    path = tmp_path / "x.jsonl"
    path.write_text('{"t": 1.0, "event": "run"}\n\n' + line + "\n")
    with pytest.raises(ValueError, match=match):
        read_timeline(str(path))


def test_the_reader_skips_blank_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('\n{"t": 1.0, "event": "run"}\n   \n{"t": 2, "event": "end"}\n')
    assert read_timeline(str(path)) == [{"t": 1.0, "event": "run"}, {"t": 2, "event": "end"}]


# -- the view model ------------------------------------------------------------------------------------

SMALL = [
    {"t": 100.0, "event": "run", "places": 2, "threads": 1, "host": "h0", "pid": 7},
    {"t": 100.0, "event": "join", "place": 0, "host": "h0"},
    {"t": 100.5, "event": "join", "place": 1, "host": "h1"},
    {"t": 101.0, "event": "load", "place": 1, "glb": 5, "processed": 0, "workers": 1, "shared": 0},
    {"t": 101.5, "event": "join", "place": 2, "host": "h2"},
    {"t": 101.5, "event": "phase", "order": "grow", "phase": "postGrow", "n": 1, "start": 101.4,
     "seconds": 0.05, "source": "GLB"},
    {"t": 101.5, "event": "phase", "order": "grow", "phase": "preGrow", "n": 1, "start": 101.0, "seconds": 0.1},
    {"t": 101.5, "event": "phase", "order": "grow", "phase": "placeStart", "n": 1, "start": 101.1,
     "seconds": 0.3},
    {"t": 101.5, "event": "phase", "order": "grow", "phase": "postGrow", "n": 1, "start": 101.4, "seconds": 0.1},
    {"t": 101.5, "event": "order", "order": "grow", "n": 1, "start": 101.0, "seconds": 0.5, "places": [2]},
    {"t": 102.2, "event": "leave", "place": 2, "host": "h2", "why": "shrink"},
    {"t": 102.25, "event": "phase", "order": "shrink", "phase": "preShrink", "n": 1, "start": 102.0,
     "seconds": 0.1},
    {"t": 102.25, "event": "phase", "order": "shrink", "phase": "placeStop", "n": 1, "start": 102.1,
     "seconds": 0.1},
    {"t": 102.25, "event": "phase", "order": "shrink", "phase": "postShrink", "n": 1, "start": 102.2,
     "seconds": 0.05},
    {"t": 102.25, "event": "order", "order": "shrink", "n": 1, "start": 102.0, "seconds": 0.25,
     "places": [2]},
    {"t": 102.5, "event": "leave", "place": 1, "host": "h1", "why": "failed", "reason": "it exited"},
    {"t": 103.0, "event": "leave", "place": 0, "host": "h0", "why": "end"},
    {"t": 103.0, "event": "end"},
    # written when they reached place 0: after the place left, out of time order
    {"t": 101.6, "event": "load", "place": 2, "glb": 5, "processed": 0, "workers": 0, "shared": 0},
    {"t": 102.1, "event": "load", "place": 2, "glb": 5, "processed": 20, "workers": 0, "shared": 0},
    {"t": 101.5, "event": "load", "place": 1, "glb": 5, "processed": 50, "workers": 1, "shared": 0},
    {"t": 102.0, "event": "load", "place": 1, "glb": 5, "processed": 150, "workers": 1, "shared": 0},
]

GROW_MARK = {"t": 1.0, "kind": "grow", "key": "grow",
             "label": "grow +1: 0.50 s (pre 0.10, places 0.30, post 0.10)"}
SHRINK_MARK = {"t": 2.0, "kind": "shrink", "key": "shrink",
               "label": "shrink -1: 0.25 s (pre 0.10, places 0.10, post 0.05)"}
FAILED_MARK = {"t": 2.5, "kind": "failed", "key": "failed", "label": "place 1 failed: it exited",
               "rows": [1]}
MARKS = [GROW_MARK, SHRINK_MARK, FAILED_MARK]


def test_the_model_of_a_small_timeline():
    assert timeline_model(SMALL) == {
        "title": "APGAS run timeline",
        "subtitle": "started 1970-01-01 00:01:40 UTC on h0 (pid 7) with 2 place(s), 1 thread(s) each",
        "t0": 0.0, "t1": 3.0,
        "sections": [
            {"kind": "gantt", "id": "places", "title": "Places over time",
             "rows": ["place 0 (h0)", "place 1 (h1)", "place 2 (h2)"],
             "bars": [[0, 0.0, 3.0, "0", "place 0"], [1, 0.5, 2.5, "1", "place 1"],
                      [2, 1.5, 2.2, "2", "place 2"]],
             "marks": MARKS,
             "legend": {}},
            {"kind": "series", "id": "work", "title": "Work per place", "unit": "items/s", "step": False,
             "series": [{"name": "place 1", "key": "1", "points": [[1.5, 100.0], [2.0, 200.0]]},
                        {"name": "place 2", "key": "2", "points": [[2.1, 40.0]]}],
             "marks": MARKS},
            {"kind": "table", "id": "orders", "title": "Orders",
             "columns": ["t [s]", "order", "places", "pre [s]", "places [s]", "post [s]", "total [s]",
                         "GLB [s]"],
             "rows": [[1.0, "grow", "2", 0.1, 0.3, 0.1, 0.5, 0.05],
                      [2.0, "shrink", "2", 0.1, 0.1, 0.05, 0.25, 0.0]]},
            {"kind": "metrics", "id": "summary", "title": "Summary",
             "items": [["run [s]", 3.0], ["places at most", 3], ["grows", 1], ["shrinks", 1],
                       ["places added", 1], ["places removed", 1], ["places failed", 1],
                       ["resize time [s]", 0.75], ["items processed", 170]]},
        ]}
    json.dumps(timeline_model(SMALL), allow_nan=False)  # JSON-serialisable


def test_the_model_of_a_file_of_two_runs_shows_the_last_unless_told():
    second = [dict(e, t=e["t"] + 1000) for e in SMALL[:3]]  # cut short: no end
    model = timeline_model(SMALL + second)
    assert model["subtitle"].endswith("; no end line: the run was cut short or still runs; "
                                      "run 2 of 2 in the file")
    assert model["sections"][0]["bars"] == [[0, 0.0, 0.5, "0", "place 0"], [1, 0.5, 0.5, "1", "place 1"]]
    assert timeline_model(SMALL + second, 0)["sections"][0]["rows"] == ["place 0 (h0)", "place 1 (h1)",
                                                                        "place 2 (h2)"]


def test_many_samples_are_merged_to_a_few_hundred_points():
    events = [{"t": i * 0.01, "event": "load", "place": 1, "glb": 1, "processed": 3 * i} for i in range(2001)]
    points = timeline_model(events)["sections"][1]["series"][0]["points"]
    assert len(points) <= 400
    assert all(v == pytest.approx(300.0) for _, v in points)
    assert points[-1][0] == 20.0


# -- the command -------------------------------------------------------------------------------------

def write_small(path: Path) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in SMALL))


def test_the_command_writes_a_page(tmp_path):
    source, out = tmp_path / "t.jsonl", tmp_path / "t.html"
    write_small(source)
    done = subprocess.run([sys.executable, "-m", "apgas", "timeline", str(source), "--html", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out}: 3 place(s), 2 order(s), 3.00 s")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Places over time" in page
    assert "<script src" not in page and "<link" not in page  # self-contained
    assert '"label":"grow +1: 0.50 s (pre 0.10, places 0.30, post 0.10)"' in page  # the model


@pytest.mark.parametrize("content, match", [
    (None, "no such file"),
    ("", "the timeline is empty"),
    ('{"t": 1, "event": "run"}\n{oops\n', r"t\.jsonl:2: not a JSON line"),
])
def test_the_command_explains_a_bad_file(tmp_path, capsys, content, match):
    from apgas.__main__ import main

    source = tmp_path / "t.jsonl"
    if content is not None:
        source.write_text(content)
    assert main(["timeline", str(source), "--html", str(tmp_path / "t.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("apgas timeline: error: ") and str(source) in err
    assert __import__("re").search(match, err), err
    assert not (tmp_path / "t.html").exists()


def test_the_command_picks_a_run(tmp_path, capsys):
    from apgas.__main__ import main

    source = tmp_path / "t.jsonl"
    write_small(source)
    with source.open("a") as f:
        f.write(json.dumps(SMALL[0]) + "\n")
    out = tmp_path / "t.html"
    assert main(["timeline", str(source), "--html", str(out), "--run", "1"]) == 0
    assert "run 1 of 2" in capsys.readouterr().out
    assert main(["timeline", str(source), "--html", str(out), "--run", "3"]) == 2
    assert "holds 2 run(s); --run must be between 1 and 2" in capsys.readouterr().err


def test_the_page_draws_places_work_and_resizes_in_a_browser(tmp_path, browser):
    source, out = tmp_path / "t.jsonl", tmp_path / "t.html"
    write_small(source)
    subprocess.run([sys.executable, "-m", "apgas", "timeline", str(source), "--html", str(out)],
                   check=True, capture_output=True, cwd=ROOT, timeout=60)
    browser.get(out.as_uri())
    drawn = browser.execute_script("""
        const q = s => Array.from(document.querySelectorAll(s));
        return {rows: q('#places text.row-label').map(t => t.textContent),
                bars: q('#places rect.bar').map(r => r.dataset.key),
                marks: q('#places .mark').map(m => m.getAttribute('class')),
                lines: q('#work path.line').map(p => p.dataset.key),
                orders: q('#orders tr').length - 1};""")
    assert drawn["rows"] == ["place 0 (h0)", "place 1 (h1)", "place 2 (h2)"]
    assert sorted(drawn["bars"]) == ["0", "1", "2"]
    assert drawn["marks"] == ["mark grow", "mark shrink", "mark failed"]
    assert sorted(drawn["lines"]) == ["1", "2"] and drawn["orders"] == 2
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
