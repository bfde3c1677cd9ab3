"""``python -m apgas``, called in this process as ``main(argv)``: it runs a script at
place 0 with its own arguments, turns the script's APGAS errors into exit 1 and
Ctrl-C into 130, refuses a missing script, and the timeline command explains a
file it cannot read or draw, or a page it cannot write (exit 2)."""

from __future__ import annotations

import json
import sys

import pytest

from apgas.__main__ import main

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def own_argv_and_path(monkeypatch):
    """``main`` sets ``sys.argv`` and puts the script's directory on ``sys.path``."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("APGAS_PLACES", raising=False)


def test_script_runs_at_place_0_with_its_arguments(tmp_path):
    """The script runs as ``__main__`` at place 0 of the places asked for, sees its own
    arguments in ``sys.argv`` and can import modules beside it."""
    (tmp_path / "helper_beside.py").write_text("VALUE = 41\n")
    out = tmp_path / "out.json"
    script = tmp_path / "prog.py"
    script.write_text(
        "import json, sys\nimport apgas\nfrom helper_beside import VALUE\n"
        "if __name__ == '__main__':\n"
        "    with open(sys.argv[1], 'w') as f:\n"
        "        json.dump({'here': apgas.here().id, 'places': len(apgas.places()),\n"
        "                   'argv': sys.argv[1:], 'value': VALUE + 1}, f)\n")
    assert main(["-n", "1", "-t", "2", str(script), str(out), "--flag", "x"]) == 0
    assert json.loads(out.read_text()) == {"here": 0, "places": 1, "argv": [str(out), "--flag", "x"],
                                           "value": 42}


def test_script_errors_become_exit_statuses(tmp_path, capsys):
    """An ApgasError out of the script is exit 1 with its message; Ctrl-C is 130."""
    failing = tmp_path / "failing.py"
    failing.write_text("import apgas\nraise apgas.ApgasError('the script gave up')\n")
    assert main(["-n", "1", str(failing)]) == 1
    assert "apgas: error: the script gave up" in capsys.readouterr().err
    interrupted = tmp_path / "interrupted.py"
    interrupted.write_text("raise KeyboardInterrupt\n")
    assert main(["-n", "1", str(interrupted)]) == 130


def test_missing_script_is_a_usage_error(tmp_path, capsys):
    """A script that is not a file stops the command before any place starts, naming it."""
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nope.py")])
    assert e.value.code == 2
    assert f"script '{tmp_path / 'nope.py'}' not found" in capsys.readouterr().err


def timeline_error(argv, capsys) -> str:
    assert main(["timeline", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("apgas timeline: error: ")
    return err


def test_timeline_unreadable_undrawable_or_unwritable(tmp_path, capsys):
    """A file that is not text, events a page cannot be drawn from, and a page path that
    cannot be written are each named; no page is left."""
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00not utf-8\n")
    page = tmp_path / "t.html"
    assert f"{binary}: cannot be read" in timeline_error([str(binary), "--html", str(page)], capsys)
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"t": 0, "event": "run"}) + "\n" + json.dumps({"t": 1, "event": "order", "order": "grow"}) + "\n")
    assert f"{odd}: not a timeline apgas can draw: KeyError('start')" in timeline_error([str(odd), "--html", str(page)], capsys)
    assert not page.exists()
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"t": 0, "event": "run"}) + "\n")
    directory = tmp_path / "a-directory"
    directory.mkdir()
    assert f"cannot write {directory}" in timeline_error([str(good), "--html", str(directory)], capsys)
