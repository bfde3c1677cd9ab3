"""Issue 40, items 3 and 4: a client's text in root's log and in every user's
``status``. Each attack comes from the user ``nobody`` (the system Python and a raw
JSON line over the Unix socket) against a root scheduler with ``--socket-mode 666``:

3. a job name with a newline and a forged log line, with ESC/OSC sequences, with a
   lone surrogate (``"\\udcff"`` in the JSON): refused with the reason; names that
   an older scheduler took (in its state) are escaped in the log and in ``status``;
4. names (and commands, ``env``, ``cwd``) of 1 MB: refused, and the daemon's files
   do not grow.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import eventually
from test_authentication import SYSTEM_PY

from apgas_scheduler.__main__ import _status_table
from apgas_scheduler.jobs import JobFileError, JobSpec, parse_job
from apgas_scheduler.live.views import dashboard_model

pytestmark = [pytest.mark.timeout(90)]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacks come from the "
                                                       "user nobody against a root scheduler")
ROOT = Path(__file__).resolve().parents[2]
MAX_NAME = 200  # characters of a name, as docs/security.md says
FORMAT = logging.Formatter("%(asctime)s %(name)s: %(message)s")  # the daemon's (serve)
FORGED = "2024-01-01 00:00:00,000 scheduler: job 1 (root-short) cancelled by root"
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b1m\x7f"
SEND = ("import socket, sys\n"  # the request on stdin: 1 MB does not fit in an argument
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "s.sendall(sys.stdin.buffer.read())\n"
        "sys.stdout.buffer.write(s.makefile('rb').readline())\n")


@pytest.fixture
def shared_sched(make_scheduler, caplog):
    caplog.set_level(logging.INFO)
    return lambda: make_scheduler(nodes=2, policy="fcfs", socket_mode=0o666)


def nobody_sends(sched, line: str) -> dict:
    """Send one raw JSON line over the scheduler's Unix socket as the user nobody."""
    out = subprocess.run([SYSTEM_PY, "-c", SEND, str(sched.socket_path)], user="nobody", cwd="/",
                         input=line.encode("ascii") + b"\n", capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def submit_line(**job) -> str:
    """A submit as raw JSON (ASCII: a lone surrogate goes as its escape, ``\\udcff``)."""
    return json.dumps({"op": "submit", "job": {"name": "j", "command": ["/bin/true"],
                                               "class": "rigid", "nodes": 1, "walltime": 30,
                                               "cwd": "/", **job}})


def log_text(caplog) -> str:
    """Root's log as ``serve`` writes it."""
    return "\n".join(FORMAT.format(r) for r in caplog.records)


def raw_characters(text: str) -> list[str]:
    """The characters of ``text`` a terminal or a log reader would act on (not newlines)."""
    return sorted({repr(c) for c in text if c != "\n" and not c.isprintable()})


def status_cli(sched) -> subprocess.CompletedProcess:
    """``python -m apgas_scheduler status`` (root's: nobody cannot read this Python)."""
    return subprocess.run([sys.executable, "-m", "apgas_scheduler", "status", "--to",
                           "{}:{}".format(*sched.address)], capture_output=True, timeout=60, cwd=ROOT)


def check_status(sched) -> str:
    """Status as text works for root (the CLI) and for nobody (their reply, as the CLI
    shows it), and holds no raw control character; returns root's."""
    out = status_cli(sched)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    text = out.stdout.decode("utf-8")  # strict: a lone surrogate cannot be in it
    assert raw_characters(text) == [], text
    theirs = nobody_sends(sched, '{"op": "status"}')
    assert theirs.pop("ok"), theirs
    assert raw_characters(_status_table(theirs)) == []
    return text


def ran_after(sched) -> None:
    """The scheduler still takes nobody's submits and runs them."""
    reply = nobody_sends(sched, submit_line(name="after"))
    assert reply["ok"], reply
    eventually(lambda: next(j for j in sched.status()["jobs"] if j["id"] == reply["id"])["state"]
               == "done", "nobody's next job done", 30)


# -- 3. forged lines, terminal escapes, a lone surrogate -----------------------------------

@as_root
def test_a_name_with_a_newline_forges_no_line_of_roots_log(shared_sched, caplog):
    s = shared_sched()
    reply = nobody_sends(s, submit_line(name=f"innocent\n{FORGED}"))
    ran_after(s)
    log = log_text(caplog)
    assert not [line for line in log.splitlines() if line.startswith(FORGED[:10])], log
    assert not [line for line in check_status(s).splitlines() if line.startswith(FORGED[:10])]
    assert not reply.get("ok") and "key 'name': must be printable text: character 9 is " \
        "U+000A, a control character" in reply["error"], reply


@as_root
def test_terminal_escapes_reach_neither_the_log_nor_status(shared_sched, caplog):
    s = shared_sched()
    reply = nobody_sends(s, submit_line(name=ESCAPES))
    ran_after(s)
    check_status(s)
    assert raw_characters(log_text(caplog)) == []
    assert not reply.get("ok") and "character 1 is U+001B, a control character" in reply["error"]


@as_root
def test_a_lone_surrogate_breaks_no_ones_status(shared_sched, caplog):
    s = shared_sched()
    line = submit_line(name="job\udcff")
    assert '"job\\udcff"' in line  # the JSON escape, as a raw client sends it
    reply = nobody_sends(s, line)
    ran_after(s)
    check_status(s)
    assert raw_characters(log_text(caplog)) == []
    assert not reply.get("ok") and "character 4 is U+DCFF, a lone surrogate" in reply["error"]


@as_root
def test_names_an_older_scheduler_took_are_escaped_in_the_log_and_status(shared_sched, caplog):
    """A state written before names were checked may hold any: the log (a filter on
    the scheduler's logger), ``status`` and the dashboard escape them."""
    s = shared_sched()
    names = [f"innocent\n{FORGED}", ESCAPES, "job\udcff"]
    for name in names:  # as the state of an older scheduler holds them, past parse_job
        s.submit(JobSpec(name, ("/bin/true",), "rigid", 1, 1, 30.0, (), "/"))
    eventually(lambda: all(j["state"] == "done" for j in s.status()["jobs"]), "the jobs done", 30)
    text = check_status(s)
    assert "innocent\\n2024-01-01" in text and "\\x1b]0;owned" in text and "job\\udcff" in text
    log = log_text(caplog)
    assert raw_characters(log) == [] and "job\\udcff" in log
    assert not [line for line in log.splitlines() if line.startswith(FORGED[:10])], log
    table = dashboard_model(s.core.store.events())["sections"][2]
    assert raw_characters(" ".join(str(row[1]) for row in table["rows"])) == []


def test_a_stored_name_is_escaped_and_cut_and_read_again_the_same():
    """A restarted scheduler reads its jobs with ``parse_job(..., stored=True)``."""
    job = {"name": "", "command": ["/bin/true"], "class": "rigid", "nodes": 1, "walltime": 30}
    for name, shown in ((f"a\n{FORGED}", f"a\\n{FORGED}"), ("\x1b[2J\udcff", "\\x1b[2J\\udcff"),
                        ("x" * 1_000_000, "x" * (MAX_NAME - 3) + "...")):
        with pytest.raises(JobFileError, match="key 'name'"):
            parse_job({**job, "name": name})
        spec = parse_job({**job, "name": name}, "stored job 1", stored=True)
        assert spec.name == shown
        assert parse_job(spec.to_dict()) == spec  # what the state holds now: taken as it is


# -- 4. a megabyte of text ---------------------------------------------------------------

def files_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


MB = 1_000_000


@as_root
@pytest.mark.parametrize("key, job, said", [
    ("name", {"name": "x" * MB}, f"key 'name': is {MB} characters long; at most 200 are taken"),
    ("command", {"command": ["/bin/echo", "x" * MB]},
     f"key 'command': {MB + 9} characters in all; at most 65536 are taken"),
    ("env", {"env": {"BIG": "x" * MB}}, f"key 'env': {MB + 3} characters in all; at most 65536"),
    ("cwd", {"cwd": "/" + "x" * MB}, f"key 'cwd': {MB + 1} characters in all; at most 4096"),
])
def test_megabyte_texts_are_refused_and_fill_no_disk(shared_sched, caplog, tmp_path, key, job, said):
    s = shared_sched()
    ran_after(s)  # the daemon's files are all there
    before, logged = files_size(tmp_path), len(log_text(caplog))
    replies = [nobody_sends(s, submit_line(**job)) for _ in range(5)]
    check_status(s)
    grown = files_size(tmp_path) - before + len(log_text(caplog)) - logged
    assert grown < 8192, f"five 1 MB {key}s grew the daemon's files and log by {grown} bytes"
    for reply in replies:
        assert not reply.get("ok") and said in reply["error"], str(reply)[:300]
        assert len(reply["error"]) < 300
    if key == "name":  # a name at the limit is taken, and shown and logged whole
        name = "é" + "n" * (MAX_NAME - 1)
        reply = nobody_sends(s, submit_line(name=name))
        assert reply["ok"], reply
        assert next(j for j in s.status()["jobs"] if j["id"] == reply["id"])["name"] == name
        assert f"({name}) submitted" in log_text(caplog) and name[:20] in check_status(s)
