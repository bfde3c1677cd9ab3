"""ElastiSim job sets in our simulator (``apgas_scheduler.sim.elastisim_jobs``) and the
harness that runs a set through both simulators (``benchmarks.elastisim_compare``).

The reader's run times are checked against hand computations from the numbers in
the files; its refusals against malformed inputs. The harness runs at a tiny size,
in our simulator always and in the real ElastiSim when ``_elastisim.find()`` finds
a build (else that test skips with its reason)."""

from __future__ import annotations

import copy
import json
import math
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from apgas_scheduler._model import JobView, Start
from apgas_scheduler.sim.elastisim_jobs import (
    ElastiSimInputError,
    evaluate,
    read_input,
    read_platform,
)
from apgas_scheduler.sim.simulator import runtime_on
from benchmarks import _elastisim_agreement as agreement
from benchmarks import elastisim_compare as ec

pytestmark = pytest.mark.timeout(120)

KASSEL_FLOPS = "(flops/divide)/(1/((1-parallel_percentage)+parallel_percentage/num_nodes))"
MODEL: dict[str, Any] = {"phases": [{"iterations": "divide", "tasks": [
    {"type": "cpu", "name": "Compute", "flops": KASSEL_FLOPS, "computation_pattern": "UNIFORM"}]}]}

# The Kassel generator's platform, 8 nodes of 1 Tflop/s (written with a unit).
PLATFORM = """<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="MySyntheticCluster" routing="Full">
    <zone id="Batch-system_zone" routing="Full">
      <host id="Batch_system" speed="0Gf"><prop id="batch_system" value="true"/></host>
    </zone>
    <cluster id="Crossbar" prefix="Syn_" radical="{radical}" suffix="" speed="{speed}"
             bw="100Gbps" lat="50us">
      <prop id="node_local_bb" value="false"/>
      <prop id="pfs_targets" value="PFS"/>
    </cluster>
    <zone id="PFS_zone" routing="Full">
      <host id="PFS" speed="0Gf"><prop id="pfs_host" value="true"/></host>
    </zone>
    <link id="PFS_read" bandwidth="300GBps" latency="500us"/>
    <link id="PFS_write" bandwidth="300GBps" latency="500us"/>
    <zoneRoute src="PFS_zone" dst="Crossbar" gw_src="PFS" gw_dst="Syn_Crossbar_router"
               symmetrical="NO"><link_ctn id="PFS_read"/></zoneRoute>
    <zoneRoute src="Crossbar" dst="PFS_zone" gw_src="Syn_Crossbar_router" gw_dst="PFS"
               symmetrical="NO"><link_ctn id="PFS_write"/></zoneRoute>
  </zone>
</platform>
"""

CONFIG: dict[str, Any] = {
    "scheduling_interval": 60, "min_scheduling_interval": 0, "schedule_on_job_submit": True,
    "schedule_on_job_finalize": True, "schedule_on_scheduling_point": True,
    "allow_oversubscription": False, "sensing": False, "sensing_interval": 60,
    "zmq_url": "ipc:///tmp/elastisim.ipc", "pfs_read_links": ["PFS_read"],
    "pfs_write_links": ["PFS_write"], "jobs_file": "data/input/jobs.json",
    "platform_file": "data/input/crossbar.xml", "job_statistics": "data/output/job_statistics.csv",
    "cpu_utilization": "data/output/cpu_utilization.csv",
    "node_utilization": "data/output/node_utilization.csv",
    "network_activity": "data/output/network_activity.csv",
    "pfs_utilization": "data/output/pfs_utilization.csv",
    "gpu_utilization": "data/output/gpu_utilization.csv"}

AM = "data/input/application_model.json"
# Four jobs as the Kassel generator writes them; the one submitted at 5 is listed last.
JOBS: list[dict[str, Any]] = [
    {"type": "RIGID", "submit_time": 0, "num_nodes": 4, "walltime": 3600, "application_model": AM,
     "arguments": {"divide": 1, "parallel_percentage": 0.95, "flops": 2e15, "num_nodes_pref": 4,
                   "id": 0}},
    {"type": "MALLEABLE", "submit_time": 10, "num_nodes_min": 2, "num_nodes_max": 8,
     "application_model": AM,
     "arguments": {"divide": 10.0, "parallel_percentage": 0.9, "flops": 3e15, "num_nodes_pref": 4,
                   "id": 1}},
    {"type": "MOLDABLE", "submit_time": 10, "num_nodes_min": 1, "num_nodes_max": 4,
     "application_model": AM,
     "arguments": {"divide": 1, "parallel_percentage": 0.99, "flops": 1e15, "id": 2}},
    {"type": "MALLEABLE", "submit_time": 5, "num_nodes_min": 1, "num_nodes_max": 4,
     "application_model": AM,
     "arguments": {"divide": 2.5, "parallel_percentage": 0.8, "flops": 1e15, "num_nodes_pref": 2,
                   "id": 3}},
]


def write_input(folder: Path, *, jobs: list[dict[str, Any]] | None = None,
                model: Any = None, platform: str | None = None,
                config: dict[str, Any] | None = None) -> Path:
    """An ElastiSim input folder as the Kassel generator lays it out."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "configuration.json").write_text(json.dumps(CONFIG if config is None else config))
    (folder / "jobs.json").write_text(json.dumps({"jobs": JOBS if jobs is None else jobs}))
    (folder / "application_model.json").write_text(json.dumps(MODEL if model is None else model))
    (folder / "crossbar.xml").write_text(
        platform if platform is not None else PLATFORM.format(radical="0-7", speed="1Tf"))
    return folder


# -- the reader ----------------------------------------------------------------------------------

def test_runtimes_are_the_hand_computed_ones(tmp_path: Path) -> None:
    s = read_input(write_input(tmp_path))
    assert (s.nodes, s.node_speed, s.scheduling_interval) == (8, 1e12, 60.0)
    by_name = {j.name: j for j in s.jobs}
    # ids in submission order, a tie in file order: 0 at 0 s, 3 at 5 s, 1 and 2 at 10 s
    assert [j.name for j in s.jobs] == ["rigid-0", "malleable-3", "malleable-1", "moldable-2"]
    assert [j.id for j in s.jobs] == [0, 1, 2, 3]

    rigid = by_name["rigid-0"]  # 2e15 flops / 1e12 flop/s = 2000 s on one node
    assert (rigid.cls, rigid.min_nodes, rigid.preferred, rigid.max_nodes) == ("rigid", 4, 4, 4)
    assert rigid.runtime == pytest.approx(2000 * (0.05 + 0.95 / 4), rel=1e-12)  # 575 s
    assert rigid.runtime == pytest.approx(575.0, rel=1e-12)
    assert rigid.estimate == 3600.0  # its walltime
    assert rigid.serial == pytest.approx(0.05, abs=1e-12)

    mall = by_name["malleable-1"]  # 10 iterations of 3e14 flops' worth: 3000 s on one node
    assert (mall.cls, mall.min_nodes, mall.preferred, mall.max_nodes) == ("malleable", 2, 4, 8)
    assert mall.runtime == pytest.approx(3000 * (0.1 + 0.9 / 4), rel=1e-12)  # 975 s
    assert mall.estimate == mall.runtime  # no walltime: the run time at the preferred size
    assert mall.serial == pytest.approx(0.1, abs=1e-12)
    assert s.iterations[mall.id] == 10

    # no num_nodes_pref: the Kassel extension's (min + max) // 2 = 2
    mold = by_name["moldable-2"]
    assert (mold.cls, mold.min_nodes, mold.preferred, mold.max_nodes) == ("moldable", 1, 2, 4)
    assert mold.runtime == pytest.approx(1000 * (0.01 + 0.99 / 2), rel=1e-12)  # 505 s

    # divide 2.5: ElastiSim reads the phase's iterations with std::stoi ("2.500000" -> 2)
    # and gives each 1e15 / 2.5 flops' worth, so the job does 80% of its flops
    odd = by_name["malleable-3"]
    assert s.iterations[odd.id] == 2
    assert odd.runtime == pytest.approx(2 * 400 * (0.2 + 0.8 / 2), rel=1e-12)  # 480 s

    # our Amdahl model gives ElastiSim's run time at every size in the job's range
    for job in s.jobs:
        for n in range(job.min_nodes, job.max_nodes + 1):
            assert runtime_on(job, n, job.runtime, "amdahl") == pytest.approx(
                s.runtime_on(job.id, n), rel=1e-9)
    assert s.runtime_on(mall.id, 8) == pytest.approx(3000 * (0.1 + 0.9 / 8), rel=1e-12)
    assert any("end of an iteration" in n for n in s.notes)


def test_the_published_small_input(tmp_path: Path) -> None:
    """``input_files/small`` of MalleableJobScheduling, as published."""
    tarball = ec.SHARED / ec.KASSEL_TARBALL
    if not tarball.is_file():
        pytest.skip(f"no {tarball}")
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    s = read_input(tmp_path / "MalleableJobScheduling" / "input_files" / "small")
    assert (s.nodes, s.node_speed, len(s.jobs)) == (16, 1e12, 8)
    first = s.jobs[0]  # RIGID on 4 nodes, flops 1.74634396233318e+17, parallel_percentage 0.95
    assert first.runtime == pytest.approx(1.74634396233318e17 / 1e12 * (0.05 + 0.95 / 4), rel=1e-12)
    assert first.serial == pytest.approx(0.05, abs=1e-12)
    assert s.jobs[1].runtime == pytest.approx(5e12 / 1e12 * (0.001 + 0.999), rel=1e-12)


def test_formulas_follow_exprtk() -> None:
    assert evaluate("2*3^2") == 18.0  # ^ is a power, above *
    assert evaluate("(10/4)/(1/((1-0.5)+0.5/2))") == pytest.approx(2.5 * 0.75)
    assert evaluate("max(1, min(4, 3)) + sqrt(16)") == 7.0
    for bad, word in (("flops*2", "'flops'"), ("1/0", "cannot be evaluated"), ("2 +", "not a formula"),
                      ("__import__('os')", "__import__"), ("1" + "+1" * 100_000, "not a formula"),
                      ("2\x00", "not a formula")):
        with pytest.raises(ElastiSimInputError, match=word):
            evaluate(bad)


def test_the_platform_counts_compute_hosts_only(tmp_path: Path) -> None:
    path = tmp_path / "p.xml"
    path.write_text(PLATFORM.format(radical="0-3,8,10-11", speed="2.5Gf"))
    p = read_platform(path)
    assert (p.nodes, p.speed) == (7, 2.5e9)
    path.write_text(PLATFORM.format(radical="0-3", speed="1e9").replace(
        '<zone id="PFS_zone"', '<host id="odd" speed="2Gf"/><zone id="PFS_zone"'))
    with pytest.raises(ElastiSimInputError, match="different speeds"):
        read_platform(path)
    path.write_text(PLATFORM.format(radical="0-3", speed="12parsecs"))
    with pytest.raises(ElastiSimInputError, match="'12parsecs' is not a SimGrid speed"):
        read_platform(path)


def _job(i: int, **changes: Any) -> list[dict[str, Any]]:
    jobs = copy.deepcopy(JOBS)
    for key, value in changes.items():
        if key.startswith("arg_"):
            jobs[i]["arguments"][key[4:]] = value
        elif value is None:
            jobs[i].pop(key, None)
        else:
            jobs[i][key] = value
    return jobs


def _model_task(**changes: Any) -> dict[str, Any]:
    model = copy.deepcopy(MODEL)
    model["phases"][0]["tasks"][0].update(changes)
    return model


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("type", {"jobs": _job(0, type="ELASTIC")}, "type is 'ELASTIC', not RIGID"),
    ("no type", {"jobs": _job(0, type=None)}, "type is null"),
    ("rigid without nodes", {"jobs": _job(0, num_nodes=None)}, "num_nodes is null"),
    ("zero nodes", {"jobs": _job(0, num_nodes=0)}, "num_nodes is 0, not a whole number >= 1"),
    ("fractional nodes", {"jobs": _job(0, num_nodes=2.5)}, "num_nodes is 2.5"),
    ("min above max", {"jobs": _job(1, num_nodes_min=9)}, "num_nodes_min 9 is above num_nodes_max 8"),
    ("pref outside", {"jobs": _job(1, arg_num_nodes_pref=16)},
     r"num_nodes_pref 16 is outside \[num_nodes_min, num_nodes_max\] = \[2, 8\]"),
    ("pref not whole", {"jobs": _job(1, arg_num_nodes_pref=4.0)}, "num_nodes_pref is 4.0"),
    ("negative submit", {"jobs": _job(0, submit_time=-5)}, "submit_time is -5"),
    ("submit text", {"jobs": _job(0, submit_time="soon")}, "submit_time is 'soon'"),
    ("walltime float", {"jobs": _job(0, walltime=3600.5)}, "walltime is 3600.5"),
    ("argument bool", {"jobs": _job(0, arg_divide=True)}, "argument 'divide' is true"),
    ("argument name", {"jobs": _job(0, **{"arg_a.b": 1})}, "argument name 'a.b'"),
    ("GPUs", {"jobs": _job(0, num_gpus_per_node=2)}, "num_gpus_per_node is 2"),
    ("no model", {"jobs": _job(0, application_model="nowhere/model.json")}, "'nowhere/model.json'"),
    ("I/O task", {"model": _model_task(type="pfs_read")}, "a task of type 'pfs_read'"),
    ("communication", {"model": _model_task(bytes=1e9, communication_pattern="ALL_TO_ALL")},
     "'bytes' communicates"),
    ("pattern", {"model": _model_task(computation_pattern="ROOT_ONLY")},
     "computation_pattern 'ROOT_ONLY'"),
    ("unknown name", {"model": _model_task(flops="flops*speedup")}, "the name 'speedup'"),
    ("not Amdahl", {"model": _model_task(flops="flops/num_nodes^0.5")},
     "does not follow Amdahl's law"),
    ("nothing to do", {"model": _model_task(flops="0*flops")}, "computes nothing"),
    ("iterations text", {"model": {"phases": [{"iterations": "many", "tasks": MODEL["phases"][0]["tasks"]}]}},
     "'many' does not start with an integer"),
    ("iterations float", {"model": {"phases": [{"iterations": 3.0, "tasks": MODEL["phases"][0]["tasks"]}]}},
     "iterations 3.0 is neither a whole number"),
    ("reconfiguration phase", {"model": {**MODEL, "on_reconfiguration": MODEL["phases"][0]}},
     "'on_reconfiguration' is not modelled"),
    ("no phases", {"model": {"phases": []}}, "'phases' is \\[\\]"),
    ("oversubscription", {"config": {**CONFIG, "allow_oversubscription": True}},
     "allow_oversubscription is true"),
    ("interval", {"config": {**CONFIG, "scheduling_interval": "1m"}}, "scheduling_interval is '1m'"),
    ("platform", {"platform": "<platform"}, "not a readable platform file"),
]


@pytest.mark.parametrize("case, changes, message", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_input_is_refused_naming_the_value(tmp_path: Path, case: str,
                                                     changes: dict[str, Any], message: str) -> None:
    folder = write_input(tmp_path / "in", **changes)
    with pytest.raises(ElastiSimInputError, match=message) as info:
        read_input(folder)
    assert str(folder) in str(info.value)  # the file is named


def test_bad_json_and_missing_files_are_named(tmp_path: Path) -> None:
    folder = write_input(tmp_path / "in")
    (folder / "jobs.json").write_text("{\"jobs\": [")
    with pytest.raises(ElastiSimInputError, match="jobs.json: not a readable jobs file"):
        read_input(folder)
    (folder / "jobs.json").unlink()
    with pytest.raises(ElastiSimInputError, match="jobs_file names 'data/input/jobs.json'"):
        read_input(folder)
    with pytest.raises(ElastiSimInputError, match="not a readable ElastiSim configuration"):
        read_input(tmp_path / "elsewhere")


def test_walltime_below_the_run_time_and_oversized_jobs_are_noted(tmp_path: Path) -> None:
    jobs = _job(0, walltime=100)
    jobs[1]["num_nodes_min"] = 8
    jobs[1]["num_nodes_max"] = 8
    jobs[1]["arguments"]["num_nodes_pref"] = 8
    s = read_input(write_input(tmp_path, jobs=jobs,
                               platform=PLATFORM.format(radical="0-5", speed="1Tf")))
    notes = "\n".join(s.notes)
    assert "beyond its walltime 100 s" in notes
    assert "needs 8 nodes, the platform has 6" in notes


# -- the harness ---------------------------------------------------------------------------------

def view(jid: int, nodes: int, pref: int = 0, cls: str = "rigid") -> JobView:
    return JobView(jid, cls, nodes if cls == "rigid" else 1, nodes, 100.0, 0.0,  # type: ignore[arg-type]
                   preferred=pref)


def test_the_kassel_easy_as_it_runs_starts_only_the_head_once_per_invocation() -> None:
    policy = ec.KasselEasyAsRun()
    queue = [view(1, 4), view(2, 2), view(3, 1)]
    assert policy.decide(0.0, queue, [], 8, 8) == [Start(1, 4)]
    assert policy.decide(0.0, queue[1:], [], 4, 8) == []  # the same invocation
    assert policy.decide(60.0, queue[1:], [], 4, 8) == [Start(2, 2)]
    assert policy.decide(70.0, [view(4, 6), view(5, 1)], [], 4, 8) == []  # never backfills
    assert policy.decide(80.0, [view(6, 8, pref=3, cls="malleable")], [], 4, 8) == [Start(6, 3)]


def test_kendall_tau_with_ties() -> None:
    a = {"x": 1.0, "y": 2.0, "z": 3.0}
    assert agreement.kendall_tau(a, a) == pytest.approx(1.0)
    assert agreement.kendall_tau(a, {"x": 3.0, "y": 2.0, "z": 1.0}) == pytest.approx(-1.0)
    assert agreement.kendall_tau(a, {"x": 1.0, "y": 1.0, "z": 1.0}) is None
    assert agreement.best({"x": 1.0, "y": 1.0000001, "z": 3.0}) == ["x", "y"]


def test_the_harness_in_our_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_input(tmp_path / "tiny")
    out = tmp_path / "out.json"
    assert ec.main(["--jobs", str(folder), "--no-elastisim", "--policies", "min-agreement,malleable",
                    "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ElastiSim runs skipped: --no-elastisim" in text
    report = json.loads(out.read_text())
    assert report["skipped"] == {"elastisim": "--no-elastisim"}
    (s,) = report["sets"]
    assert s["jobs"] == 4 and s["classes"] == {"rigid": 1, "malleable": 2, "moldable": 1}
    assert [(r["simulator"], r["policy"]) for r in s["runs"]] == [
        ("ours", "easy"), ("ours", "kassel-easy*"), ("ours", "min-agreement"), ("ours", "malleable")]
    for r in s["runs"]:
        assert r["metrics"]["jobs"] == 4 and r["metrics"]["mean_turnaround"] > 0
        assert r["policy"] in text
    assert s["checks"] == {}


def test_the_harness_merges_reports_into_markdown(tmp_path: Path) -> None:
    """Two runs (--json), joined by --merge into one report and its Markdown tables."""
    runs = []
    for name in ("a", "b"):
        folder = write_input(tmp_path / name)
        runs.append(tmp_path / f"{name}.json")
        assert ec.main(["--jobs", str(folder), "--no-elastisim", "--policies", "malleable",
                        "--json", str(runs[-1])]) == 0
    joined, md = tmp_path / "all.json", tmp_path / "all.md"
    assert ec.main(["--merge", *map(str, runs), "--json", str(joined), "--markdown", str(md)]) == 0
    report = json.loads(joined.read_text())
    assert [s["name"] for s in report["sets"]] == ["a", "b"]
    assert report["tolerance"] == agreement.TOLERANCE and len(report["parameters"]) == 2
    text = md.read_text()
    assert text.count("--no-elastisim") == 2 and "--merge" in text
    assert "\n## a\n" in text and "\n## b\n" in text
    assert "| kassel-easy\\* | " in text and "| malleable | " in text
    assert ec.main(["--merge", str(tmp_path / "none.json")]) == 1


def test_the_scheduling_points_cost_of_our_resizes(tmp_path: Path) -> None:
    """ElastiSim applies a resize half an iteration at the old size later on average:
    job 2 (10 iterations) grown from 4 to 6 nodes, then shrunk to 5."""
    from apgas_scheduler._model import Grow, Shrink
    jobset = read_input(write_input(tmp_path / "in"))
    assert jobset.iterations[2] == 10
    t4, t6 = jobset.runtime_on(2, 4), jobset.runtime_on(2, 6)
    decisions = [(0.0, Start(2, 4)), (10.0, Grow(2, 2)), (20.0, Shrink(2, 1)), (30.0, Grow(7, 1))]
    held = agreement.held_at_scheduling_points(jobset, decisions, 1000.0)
    assert held is not None
    assert held["mean_delay"] == pytest.approx((t4 / 20 + t6 / 20) / 2)
    assert held["held_share"] == pytest.approx((2 * t4 / 20 + t6 / 20) / (8 * 1000.0))
    assert held["never"] == 0
    # job 0 has one iteration: ElastiSim never resizes it
    held = agreement.held_at_scheduling_points(jobset, decisions + [(0.0, Start(0, 4)),
                                                                    (9.0, Grow(0, 1))], 1000.0)
    assert held is not None and held["never"] == 1
    assert held["mean_delay"] == pytest.approx((t4 / 20 + t6 / 20) / 2)
    assert agreement.held_at_scheduling_points(jobset, decisions[:1], 1000.0) is None


def test_repair_divide_applies_the_generators_rule(tmp_path: Path) -> None:
    """divide = flops // (num_nodes_pref * speed) // split_time: 3e15 // 4e12 = 750 s -> 12
    iterations of 60 s, 1e15 // 2e12 = 500 s -> 8; the moldable job has no num_nodes_pref."""
    folder = write_input(tmp_path / "in")
    assert ec.repair_divide(folder, 60.0, 1000) == [1, 3]
    jobs = json.loads((folder / "jobs.json").read_text())["jobs"]
    assert [j["arguments"]["divide"] for j in jobs] == [1, 12.0, 1, 8.0]
    assert ec.repair_divide(folder, 60.0, 1000) == []
    assert ec.repair_divide(folder, 60.0, 5) == [1, 3]  # at most 5 iterations
    assert read_input(folder).iterations[2] == 5


def test_the_harness_refuses_an_unknown_policy(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert ec.main(["--jobs", str(tmp_path), "--policies", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def _kassel_or_skip(tmp_path: Path) -> Path:
    helpers, _ = ec.load_helpers()
    try:
        return ec.kassel_folder(None, helpers, tmp_path)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_generated_sets_share_their_jobs(tmp_path: Path) -> None:
    """The Kassel generator with their command line; the sets of one seed differ
    only in which jobs are malleable, the smaller share's among the larger's."""
    kassel = _kassel_or_skip(tmp_path / "kassel")
    sets = {share: read_input(ec.generate(kassel, tmp_path / f"in-{share}", share, "S7", 1.0, 16))
            for share in (0, 50, 100)}
    shapes = {share: [x for j in s.jobs for x in (j.submit, j.runtime, j.preferred)]
              for share, s in sets.items()}
    assert shapes[0] == pytest.approx(shapes[100], rel=1e-12)
    assert shapes[0] == pytest.approx(shapes[50], rel=1e-12)
    assert all(j.cls == "rigid" for j in sets[0].jobs)
    assert all(j.cls == "malleable" for j in sets[100].jobs)
    half = {j.id for j in sets[50].jobs if j.cls == "malleable"}
    assert half <= {j.id for j in sets[100].jobs}
    assert sets[0].nodes == 16 and len(sets[0].jobs) > 2
    # every job follows the generator's rule for its iterations but the last one it drew
    assert len(ec.repair_divide(tmp_path / "in-100", 60.0, 1000)) <= 1


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in command:
                found.append(command)
    return found


def test_the_harness_against_the_real_elastisim(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    helpers, reason = ec.load_helpers()
    folder, why = ec.elastisim_status(helpers, reason)
    if folder is None:
        pytest.skip(why)
    bridge = ec.bridge_status()
    if bridge:
        pytest.skip(bridge)
    # the Kassel extension's fallback for a job without num_nodes_pref calls a Logger.log
    # that does not exist: their strategies need the argument on every flexible job
    inputs = write_input(tmp_path / "tiny", jobs=_job(2, arg_num_nodes_pref=2))
    work, out = tmp_path / "work", tmp_path / "out.json"
    assert ec.main(["--jobs", str(inputs), "--policies", "min-agreement,malleable", "--keep",
                    str(work), "--json", str(out), "--timeout", "60"]) == 0
    report = json.loads(out.read_text())
    assert "failed" not in report["skipped"], report["skipped"]
    checks = report["sets"][0]["checks"]
    # every job at its preferred size runs as long in both (480 s for the divide-2.5 job too)
    assert checks["runtimes"]["ok"] and checks["runtimes"]["checked"] == 4, checks["runtimes"]
    assert checks["easy"]["ok"] and checks["kassel_easy"]["ok"], checks
    assert set(checks["ranking"]["ours"]) == {"min-agreement", "malleable"}
    labels = [(r["simulator"], r.get("label", r["policy"])) for r in report["sets"][0]["runs"]]
    assert ("ElastiSim", "rigid_easy_backfill (Kassel)") in labels
    assert ("ElastiSim", "min-agreement (bridge)") in labels
    assert "agree" in capsys.readouterr().out
    assert _processes_naming(str(work)) == []  # nothing left running
    assert math.isfinite(checks["easy"]["turnaround_difference"])
