"""The GLB applications in this process: the N-Queens and pi kernels' Python source
agrees with known counts and an independent reference, and ``python -m glb.apps``
(called as ``main(argv)``) refuses bad arguments naming them, and runs a small
problem to the correct result, sequentially and under the runtime."""

from __future__ import annotations

import argparse
import ast
import json
import logging
import shutil

import numpy as np
import pytest

from glb.apps import cli, nqueens, pi

pytestmark = pytest.mark.timeout(60)

# -- N-Queens ------------------------------------------------------------------------------------


def brute_force_queens(n: int) -> int:
    """Solutions counted by trying every column for each row (no bitboards)."""
    def place(row: int, cols: tuple[int, ...]) -> int:
        if row == n:
            return 1
        return sum(place(row + 1, (*cols, c)) for c in range(n)
                   if all(c != d and abs(c - d) != row - r for r, d in enumerate(cols)))
    return place(0, ())


@pytest.mark.parametrize("n", range(1, 8))
def test_nqueens_kernel_source_counts_every_solution(n):
    """The kernels run as Python (``py_func``) count what brute force counts, for every
    threshold, and agree with the compiled kernels prefix by prefix."""
    expected = brute_force_queens(n)
    assert expected == nqueens.REFERENCE[n]
    for t in range(n + 1):
        count = nqueens._enumerate.py_func(n, t, np.empty((0, 4), np.int64))
        tasks = np.empty((count, 4), np.int64)
        assert nqueens._enumerate.py_func(n, t, tasks) == count
        assert np.array_equal(tasks, nqueens.prefixes(n, t))
        assert nqueens._solve.py_func(n, tasks) == expected
        assert nqueens._solve(n, tasks) == expected


def test_nqueens_sequential_and_check_use_the_reference():
    """``sequential`` solves the empty board; ``check`` knows right from wrong, and says
    nothing for a board size it has no count of."""
    result = nqueens.sequential({"n": 8, "threshold": 0})
    assert (result.solutions, result.tasks) == (92, 1)
    assert repr(result) == "NQueensResult(solutions=92, tasks=1)"
    assert nqueens.check({"n": 8}, 92) is True
    assert nqueens.check({"n": 8}, 91) is False
    assert nqueens.check({"n": 25}, 1) is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_nqueens_compare_against_c(capsys):
    """The comparison CLI counts the same solutions with numba and with the C program."""
    nqueens._compare_main(["6"])
    row = ast.literal_eval(capsys.readouterr().out.strip())
    assert row["n"] == 6 and row["numba_solutions"] == 4
    assert row["c_solutions"] == 4 and row["c_s"] > 0 and row["ratio"] > 0


def test_nqueens_c_reference_without_a_compiler(tmp_path, monkeypatch, caplog):
    """Without ``cc`` on the PATH, or with one that fails, there is no C reference (a
    warning says why), and the comparison has the numba side only."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="glb.apps.nqueens"):
        assert nqueens.c_reference_seconds(6) is None
    assert "no C compiler" in caplog.text
    row = nqueens.compare(5)
    assert sorted(row) == ["n", "numba_s", "numba_solutions"]
    assert (row["n"], row["numba_solutions"]) == (5, 10) and row["numba_s"] >= 0
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: out of ink' >&2\nexit 1\n")
    cc.chmod(0o755)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="glb.apps.nqueens"):
        assert nqueens.c_reference_seconds(6) is None
    assert "out of ink" in caplog.text


# -- pi ------------------------------------------------------------------------------------------

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix_mix(z: int) -> int:
    """The splitmix64 finaliser on Python integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_hits(seed: int, chunk: int, samples: int) -> int:
    """Hits of one chunk, as the module's docstring specifies them, on Python integers."""
    state = splitmix_mix((splitmix_mix((seed + GOLDEN) & M64) + chunk) & M64)
    inside = 0
    for _ in range(samples):
        state = (state + GOLDEN) & M64
        z = splitmix_mix(state)
        x, y = z >> 33, z & ((1 << 31) - 1)
        inside += x * x + y * y < 1 << 62
    return inside


@pytest.mark.parametrize("seed", [0, 7, M64])
def test_pi_kernel_source_matches_splitmix64(seed):
    """The kernels run as Python draw the same points as splitmix64 on Python integers,
    and the compiled kernels too; the last, short chunk draws only what is left."""
    s = np.uint64(seed)
    with np.errstate(over="ignore"):
        for z in (0, 1, GOLDEN, M64):
            assert int(pi._mix.py_func(np.uint64(z))) == splitmix_mix(z)
        for chunk in range(3):
            expected = reference_hits(seed, chunk, 50)
            assert pi._chunk_hits.py_func(s, chunk, 50) == expected
            assert pi._chunk_hits(s, chunk, 50) == expected
        whole = sum(reference_hits(seed, c, min(50, 120 - 50 * c)) for c in range(3))
        assert pi._hits.py_func(s, 0, 3, 50, 120) == whole
    assert pi.hits(seed, 0, 3, 50, 120) == whole


def test_pi_result_and_count_arguments():
    """A result folds and estimates (NaN without samples); counts may be written as
    ``2e3`` or ``2_000`` but must be whole."""
    r = pi.PiResult(3, 4)
    r.fold(pi.PiResult(0, 0))
    assert (r.estimate(), repr(r)) == (3.0, "PiResult(hits=3, samples=4)")
    assert np.isnan(pi.PiResult().estimate())
    assert pi._count("2e3") == pi._count("2_000") == 2000
    with pytest.raises(argparse.ArgumentTypeError, match="not a whole number: '2.5'"):
        pi._count("2.5")


# -- the command line ----------------------------------------------------------------------------


def cli_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_cli_refuses_bad_arguments_naming_them(capsys, monkeypatch, tmp_path):
    """Each bad argument stops the command line before any place starts, with a
    message that names it and its value."""
    monkeypatch.delenv("APGAS_SCHEDULER", raising=False)
    assert "got 0 and 1" in cli_error(["pi", "--places", "0"], capsys)
    assert "got None and 0" in cli_error(["pi", "--workers", "0"], capsys)
    assert "APGAS_SCHEDULER is not set" in cli_error(["pi", "--evolving"], capsys)
    assert "-n (board size) must be an integer in 1..30, got 31" in cli_error(
        ["nqueens", "-n", "31"], capsys)
    assert "--samples must be an integer in 1" in cli_error(["pi", "--samples", "0"], capsys)
    assert "--checkpoint-interval must be a positive number of seconds, got 0.0" in cli_error(
        ["pi", "--checkpoint-interval", "0"], capsys)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert str(not_a_dir) in cli_error(["pi", "--checkpoint", str(not_a_dir)], capsys)


def test_cli_checkpoint_directory_of_another_problem_is_refused(capsys, tmp_path):
    """A checkpoint directory claimed by one problem refuses another, naming both;
    the same problem may claim it again."""
    directory = tmp_path / "ckpt"
    cli.claim_checkpoint_dir(directory, "nqueens", {"n": 8, "threshold": 2}, static=False)
    cli.claim_checkpoint_dir(directory, "nqueens", {"n": 8, "threshold": 2}, static=False)
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    with pytest.raises(ValueError, match=r"holds snapshots of nqueens \{'n': 8, 'threshold': 2\} "
                                         r"\(dynamic\), not of nqueens .* \(static\)"):
        cli.claim_checkpoint_dir(directory, "nqueens", {"n": 8, "threshold": 2}, static=True)
    err = cli_error(["nqueens", "-n", "6", "-t", "2", "--checkpoint", str(directory)], capsys)
    assert "holds snapshots of nqueens" in err and "'n': 6" in err


def test_cli_sequential_run_is_correct(capsys, tmp_path):
    """``--sequential`` runs the kernel alone: the correct count, printed and recorded."""
    out = tmp_path / "out" / "record.json"
    assert cli.main(["nqueens", "-n", "7", "--sequential", "--json", str(out)]) == 0
    assert "nqueens {'n': 7, 'threshold': 5}: result 40  correct True" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert (record["mode"], record["result"], record["correct"], record["places"]) == (
        "sequential", 40, True, 1)
    assert record["glb_stats"] is None and record["units"] == 40


def test_cli_glb_run_in_process_is_correct(capsys, tmp_path, monkeypatch):
    """A GLB run on one place gives the sequential result; under EJS it also prints
    the initialization line EJS's scripts read."""
    for name, value in (("APGAS_PLAIN_PROTOCOL", "1"), ("APGAS_SCHEDULER", "127.0.0.1:1")):
        monkeypatch.setenv(name, value)
    for name in ("APGAS_JOB_ID", "APGAS_COMMUNICATOR"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "record.json"
    argv = ["pi", "--samples", "30000", "--chunk-size", "1000", "--sample-seed", "5",
            "--places", "1", "--workers", "2", "--json", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "Initialization time (s); " in printed
    record = json.loads(out.read_text())
    expected = pi.sequential({"samples": 30000, "chunk": 1000, "seed": 5}).estimate()
    assert record["result"] == expected and record["correct"] is True
    assert record["mode"] == "dynamic" and record["workers"] == 2
    assert sum(s["units"] for s in record["glb_stats"]) == 30


def test_cli_static_checkpointed_run_resumes_to_its_result(capsys, tmp_path):
    """A static run with ``--checkpoint`` leaves a final snapshot; the same run started
    again returns the same result from it without computing."""
    directory = tmp_path / "ckpt"
    argv = ["nqueens", "-n", "8", "-t", "2", "--places", "1", "--static", "--checkpoint",
            str(directory), "--json", str(tmp_path / "a.json")]
    assert cli.main(argv) == 0
    first = json.loads((tmp_path / "a.json").read_text())
    assert (first["result"], first["mode"], first["checkpoints"]["written"]) == (92, "static", 1)
    assert sorted(p.name for p in directory.iterdir()) == ["app.json", "glb-00000001.snapshot"]
    assert cli.main([*argv[:-1], str(tmp_path / "b.json")]) == 0
    again = json.loads((tmp_path / "b.json").read_text())
    assert again["result"] == 92 and again["checkpoints"]["resumed_from"] == 1
    assert again["glb_stats"] == []
