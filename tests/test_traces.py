"""Traces as the Parallel Workloads Archive ships them (issue 17, item 3): compressed
SWF read directly, errors that name file, line and cause, the header's cluster size,
and the four real traces in ../shared/traces parsed whole and simulated in slices."""

import bz2
import gzip
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from apgas_scheduler.policies import get_policy, policy_names
from apgas_scheduler.sim import swf
from apgas_scheduler.sim import workload as wl
from apgas_scheduler.sim.simulator import Simulator
from apgas_scheduler.sim.workload import WorkloadError, read_swf, swf_header, write_swf

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
TINY = ROOT / "tests" / "data" / "tiny.swf"

# name: (file, job lines, kept (a run time and a processor count), processors per node,
# nodes), from ../shared/traces/README.md
REAL = {
    "KTH-SP2": ("KTH-SP2-1996-2.1-cln.swf.gz", 27_992, 27_992, 1, 100),
    "HPC2N": ("HPC2N-2002-2.1-cln.swf.gz", 202_876, 202_876, 2, 120),
    "SDSC-BLUE": ("SDSC-BLUE-2000-4.2-cln.swf.gz", 243_306, 232_536, 8, 144),
    "LLNL-Thunder": ("LLNL-Thunder-2007-1.1-cln.swf.gz", 121_039, 113_613, 4, 1002),
}
SLICE = 2000

needs_traces = pytest.mark.skipif(
    not all((TRACES / f).is_file() for f, *_ in REAL.values()),
    reason=f"the real traces are not in {TRACES} (a checkout with ../shared/traces beside it "
           "has them; see ../shared/traces/README.md)")


# -- compression and errors ---------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".swf", ".swf.gz", ".swf.bz2", ".swf.xz"])
def test_compressed_traces_read_like_plain_ones(tmp_path, suffix):
    jobs = read_swf(TINY)
    path = tmp_path / f"t{suffix}"
    write_swf(jobs, path, header="MaxNodes: 4\nMaxProcs: 16")
    assert swf.compression_of(path) == {".swf": "", ".swf.gz": "gzip", ".swf.bz2": "bzip2",
                                        ".swf.xz": "xz"}[suffix]
    assert read_swf(path) == jobs
    assert swf_header(path)["MaxProcs"] == "16"


def test_compression_is_told_by_content_not_name(tmp_path):
    path = tmp_path / "trace.swf"  # gzip data under a plain name
    path.write_bytes(gzip.compress(TINY.read_bytes()))
    assert read_swf(path) == read_swf(TINY)


def test_a_name_promising_compression_the_file_lacks(tmp_path):
    path = tmp_path / "t.swf.bz2"
    path.write_bytes(TINY.read_bytes())
    with pytest.raises(WorkloadError, match=r"t\.swf\.bz2:0: named as bzip2-compressed, but its "
                                            r"first bytes are plain text"):
        read_swf(path)


@pytest.mark.parametrize("make, cause", [
    (lambda data: gzip.compress(data)[:-30], "bad gzip compression"),  # truncated
    (lambda data: b"\x1f\x8b" + b"\x00" * 40, "bad gzip compression"),
    (lambda data: bz2.compress(data)[:40] + b"garbage" * 10, "bad bzip2 compression"),
    (lambda data: lzma.compress(data)[:-20], "bad xz compression"),
])
def test_corrupt_compression_names_the_file_and_cause(tmp_path, make, cause):
    path = tmp_path / "broken.swf.x"
    path.write_bytes(make(TINY.read_bytes() * 50))
    with pytest.raises(WorkloadError, match=rf"broken\.swf\.x:\d+: {cause}"):
        read_swf(path)


def test_bytes_that_are_not_text_name_line_and_byte(tmp_path):
    lines = TINY.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:5] + b"\x8b" + lines[3][5:]
    path = tmp_path / "binary.swf.gz"
    path.write_bytes(gzip.compress(b"".join(lines)))
    with pytest.raises(WorkloadError, match=r"binary\.swf\.gz:4: not UTF-8 \(nor ASCII\) text: "
                                            r"byte 0x8b at column 6") as err:
        read_swf(path)
    assert err.value.line == 4


def test_a_bad_line_in_a_compressed_trace_names_its_line(tmp_path):
    text = TINY.read_text().splitlines()
    number = next(i for i, line in enumerate(text) if line and not line.startswith(";"))
    text[number] += " 7"
    path = tmp_path / "bad.swf.xz"
    path.write_bytes(lzma.compress(("\n".join(text) + "\n").encode()))
    with pytest.raises(WorkloadError, match=rf"bad\.swf\.xz:{number + 1}: expected 18 fields, "
                                            "found 19"):
        read_swf(path)


@pytest.mark.parametrize("header, ppn, expected", [
    ({"MaxNodes": "144", "MaxProcs": "1152"}, None, (144, 8)),
    ({"MaxNodes": "240", "MaxProcs": "240"}, None, (240, 1)),
    ({"MaxNodes": "240", "MaxProcs": "240"}, 2, (120, 2)),
    ({"MaxNodes": "1002", "MaxProcs": "4008"}, 4, (1002, 4)),
    ({"MaxNodes": "10", "MaxProcs": "25"}, None, (10, 1)),
    ({"MaxProcs": "64"}, None, (64, 1)),
    ({"MaxNodes": "-1"}, None, (None, 1)),
    ({}, 3, (None, 3)),
])
def test_cluster_from_the_header(header, ppn, expected):
    assert swf.trace_cluster(header, ppn) == expected


# -- the real traces --------------------------------------------------------------------------

@needs_traces
@pytest.mark.parametrize("name", list(REAL))
def test_real_trace_parses_whole_with_the_readme_counts(name):
    file, lines, kept, ppn, nodes = REAL[name]
    stats: dict[str, float] = {}
    jobs = read_swf(TRACES / file, procs_per_node=ppn, stats=stats)
    assert stats["jobs"] == len(jobs) == kept
    assert stats["skipped"] == lines - kept
    assert jobs[0].submit == 0.0 and all(a.submit <= b.submit for a, b in zip(jobs, jobs[1:], strict=False))
    assert swf.trace_cluster(swf_header(TRACES / file), ppn) == (nodes, ppn)


@pytest.fixture(scope="module")
def slices():
    return {name: read_swf(TRACES / file, procs_per_node=ppn, max_jobs=SLICE)
            for name, (file, _, _, ppn, _) in REAL.items()}


def every_policy_on_every_trace() -> list:
    """(policy, trace) pairs: each policy on one trace (in turn) in the README's command,
    on the others in the slow group; every policy and every trace run in both."""
    names = list(REAL)
    return [pytest.param(policy, name, id=f"{policy}-{name}",
                         marks=() if j == i % len(names) else pytest.mark.slow)
            for i, policy in enumerate(policy_names()) for j, name in enumerate(names)]


@needs_traces
@pytest.mark.parametrize("policy, name", every_policy_on_every_trace())
def test_real_trace_slice_under_every_policy(slices, name, policy):
    nodes = REAL[name][4]
    jobs = wl.make_malleable(slices[name], 0.5, seed=1, total_nodes=nodes)
    m = Simulator(nodes, get_policy(policy)).run(jobs).metrics
    assert m["jobs"] + m["rejected"] == SLICE and m["jobs"] >= SLICE * 0.99
    assert 0 < m["utilization"] <= 1 + 1e-9
    assert m["makespan"] >= max(j.submit for j in jobs)
    assert 0 <= m["mean_wait"] <= m["mean_turnaround"]
    assert m["mean_bounded_slowdown"] >= 1


@needs_traces
def test_compare_reads_an_archive_trace_and_sizes_the_cluster_from_its_header(tmp_path):
    out = tmp_path / "runs.json"
    done = subprocess.run(
        [sys.executable, "-m", "apgas_scheduler", "compare", "--trace",
         str(TRACES / REAL["SDSC-BLUE"][0]), "--max-jobs", "500", "--policies", "fcfs,easy",
         "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "500 job(s) simulated on 144 node(s)" in done.stdout  # 1152 procs / 8 per node
    assert "easy" in done.stdout and out.is_file()


def test_cli_error_names_the_trace(tmp_path):
    path = tmp_path / "noise.swf.gz"
    path.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    done = subprocess.run(
        [sys.executable, "-m", "apgas_scheduler", "simulate", "--trace", str(path),
         "--nodes", "8", "--policy", "fcfs"], capture_output=True, text=True, timeout=120,
        cwd=ROOT)
    assert done.returncode != 0
    assert "noise.swf.gz:1: bad gzip compression" in done.stderr + done.stdout
