"""APGAS from a notebook and a REPL (issue 55): places that stay up between cells, a
kernel interrupt that stops what a cell started everywhere and keeps the places, and
nothing left behind once the kernel stops. The notebook is examples/notebook_session.ipynb,
run by a real ipykernel through nbclient; the REPL is ``python -i`` on a pty."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the dev extra brings nbclient and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="the dev extra brings nbclient and ipykernel")
pytest.importorskip("ipykernel", reason="the dev extra brings nbclient and ipykernel")
pexpect = pytest.importorskip("pexpect", reason="the dev extra brings pexpect")

from tests._leaks import alive  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "notebook_session.ipynb"


def test_the_notebook_keeps_its_places_through_an_interrupt_and_leaves_nothing():
    """tests/notebook_runner.py runs the notebook (a process of its own: nbclient keeps
    an event loop for the life of the process that drives it)."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_runner.py"), str(NOTEBOOK)],
                          capture_output=True, text=True, timeout=200, cwd=str(ROOT))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-5000:]
    result = json.loads(lines[-1][7:])
    outputs = result["outputs"]
    assert "3 place(s)" in outputs[0] and "places 0-2" in outputs[0]
    ids, pids_line = outputs[1].strip().splitlines()
    assert ids == "[0, 1, 2]"
    pids = [int(p) for p in pids_line.split()[1:]]
    assert pids[0] == result["kernel_pid"] and len(set(pids)) == 3
    assert outputs[2].strip() == "True"  # the GLB bag's sum
    assert outputs[3].strip() == "raised at place 1: True"  # the cell's line in the traceback
    assert result["interrupt_error"] == "KeyboardInterrupt"
    assert result["interrupt_returned_s"] < 1.0, result
    assert outputs[5].strip() == "same places: True free: True"
    assert "ok grow 1" in outputs[6] and "4 places" in outputs[6], outputs[6]
    assert outputs[6].rstrip().endswith("3 places"), outputs[6]
    assert "shut down" in outputs[7]
    assert result["places_after"] == []
    assert not [p for p in pids if alive(p)], "left behind after the kernel stopped"


@pytest.mark.timeout(120)
def test_a_repl_keeps_its_places_through_ctrl_c():
    # SIGINT as a terminal's shell leaves it (a pytest-xdist worker ignores it, and an
    # ignored signal stays ignored across exec)
    child = pexpect.spawn(sys.executable, ["-i", "-q"], cwd=str(ROOT), encoding="utf-8",
                          timeout=60, env={**os.environ, "PYTHONSTARTUP": "", "TERM": "dumb"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def run(line: str) -> str:
            child.sendline(line)
            child.expect(">>> ")
            return child.before

        child.expect(">>> ")
        run("import apgas, os, time")
        assert "3 place(s)" in run("s = apgas.init(places=3, threads=1); s")
        run("def spin(t):\n    end = time.monotonic() + t\n    while time.monotonic() < end: time.sleep(0.01)\n")
        run("def long():\n    with apgas.finish():\n        for p in apgas.places(): apgas.async_at(p, spin, 120)\n"
            "        print('running everywhere', flush=True)\n")
        run("pids = [apgas.at(p, os.getpid) for p in apgas.places()]")
        child.sendline("long()")
        child.expect("running everywhere")
        start = time.monotonic()
        child.sendintr()  # Ctrl-C on the terminal: SIGINT to the foreground group (places ignore it)
        child.expect("KeyboardInterrupt")
        child.expect(">>> ")
        assert time.monotonic() - start < 1.0 + 1.0  # the interrupt's second, and the pty's echo
        assert "True" in run("[apgas.at(p, os.getpid) for p in apgas.places()] == pids")
        printed = run("print('PIDS', *pids)")
        pids = [int(p) for p in printed.split("PIDS", 2)[-1].split()]
        child.sendline("exit()")  # atexit shuts the places down
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert len(pids) == 3 and not [p for p in pids if alive(p)], "left behind after exit()"
