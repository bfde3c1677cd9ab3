"""Log lines name their place; APGAS_LOG_LEVEL sets the level."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import apgas

pytestmark = pytest.mark.timeout(30)


def test_log_lines_are_prefixed_with_the_place(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text("import apgas\napgas.run(lambda: None, places=3)\n")
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=20,
                         env={**os.environ, "APGAS_LOG_LEVEL": "info"})
    assert out.returncode == 0, out.stderr
    assert "[place 0] INFO apgas.run: 3 place(s) ready" in out.stderr
    for place in (1, 2):
        assert f"[place {place}] INFO apgas.serve: stopping" in out.stderr


def test_default_level_is_quiet(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text("import apgas\napgas.run(lambda: None, places=2)\n")
    env = {k: v for k, v in os.environ.items() if k != "APGAS_LOG_LEVEL"}
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=20, env=env)
    assert out.returncode == 0 and out.stderr == ""


def test_bad_log_level_is_refused(monkeypatch):
    monkeypatch.setenv("APGAS_LOG_LEVEL", "LOUD")
    with pytest.raises(apgas.ConfigError, match="APGAS_LOG_LEVEL must be a logging level name.*'LOUD'"):
        apgas.run(lambda: None)
