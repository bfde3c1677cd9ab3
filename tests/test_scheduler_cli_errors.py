"""``python -m apgas_scheduler`` in process: every bad argument, missing file or
unreachable scheduler ends with an exit code and a message that names the value,
and the client commands print what the scheduler answered (a stand-in scheduler
on a Unix socket answers them)."""

from __future__ import annotations

import json
import socket
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_scheduler_metrics import TWO_JOBS

from apgas_scheduler.__main__ import _dashboard_address, _node_address, _user, main
from apgas_scheduler.live.access import dashboard_token

DATA = Path(__file__).resolve().parent / "data"
TINY = str(DATA / "tiny.swf")
TO = ["--to", "127.0.0.1:9"]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What argparse says of ``argv``, which it must refuse with exit code 2."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """The error ``main`` prints for ``argv``, which must end with ``code``."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    return err


@pytest.fixture
def no_key(tmp_path, monkeypatch):
    """No operator's key where the client looks by default."""
    monkeypatch.setenv("APGAS_RUNTIME_DIR", str(tmp_path / "runtime"))


# -- argument values ----------------------------------------------------------------------------

def test_argument_values_are_parsed():
    assert _dashboard_address("8082") == ("127.0.0.1", 8082)
    assert _dashboard_address("10.0.0.1:80") == ("10.0.0.1", 80)
    assert _node_address("n[1-2]=10.0.0.5") == {"n1": "10.0.0.5", "n2": "10.0.0.5"}
    assert _user("0") == 0 and _user("root") == 0


@pytest.mark.parametrize("argv, message", [
    (["status", "--to", "nowhere"], "argument --to: the address must look like host:port, got 'nowhere'"),
    (["cancel", "--to", "host:99999", "1"], "got 'host:99999'"),
    (["dashboard-url", "--dashboard", "host:port"],
     "argument --dashboard: the address must look like host:port, got 'host:port'"),
    (["add-nodes", *TO, "n[x-y]"], "argument names: bad range 'x-y' in Slurm host list 'n[x-y]'"),
    (["node-up", *TO, "n[3-1]"], "argument names: empty Slurm host list 'n[3-1]'"),
    (["status", *TO, "--scheduler-user", "no-such-user-here"],
     "argument --scheduler-user: no user 'no-such-user-here' on this machine"),
    (["serve", "--node-address", "node1"], "argument --node-address: expected NODES=ADDRESS, got 'node1'"),
    (["serve", "--node-address", "=10.0.0.1"], "expected NODES=ADDRESS, got '=10.0.0.1'"),
    (["serve", "--node-address", "n[1-2]=bad host!"],
     "NODES=ADDRESS 'n[1-2]=bad host!': the address: host name 'bad host!' has characters"),
    (["serve", "--nodes", "n[a-b]"], "argument --nodes: bad range 'a-b'"),
])
def test_bad_argument_values_are_refused_with_the_value(argv, message, capsys):
    assert message in usage_error(argv, capsys)


# -- serve and slurm-controller, before they start ---------------------------------------------

def test_serve_outside_slurm_asks_for_nodes(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    assert fails(["serve"], capsys) == "error: give --nodes (not inside a Slurm allocation)\n"
    monkeypatch.setenv("SLURM_JOB_NODELIST", "c[9-x]")
    assert "error: SLURM_JOB_NODELIST: bad range '9-x'" in fails(["serve"], capsys)


def test_serve_names_the_missing_directory_of_its_socket(tmp_path, no_key, monkeypatch, capsys):
    """A --socket whose directory does not exist: the directory is named with what to
    do, and the ports and state opened before are closed again (the leak check)."""
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")  # serve adds its nodes to it
    missing = tmp_path / "no-such-dir"
    err = fails(["serve", "--nodes", "n0", "--port", "0", "--state-dir", str(tmp_path / "state"),
                 "--socket", str(missing / "s.sock")], capsys)
    assert err == (f"error: the Unix socket {missing / 's.sock'}: its directory {missing} does "
                   f"not exist; make it (mkdir -m 0711 {missing}) or give --socket a path in an "
                   "existing directory\n")


@pytest.mark.parametrize("command", ["serve", "status", "requeue", "dashboard-url"])
def test_help_shows_the_real_default_key_file(command, tmp_path, no_key, monkeypatch, capsys):
    """The operator's key file --help names is the one APGAS_RUNTIME_DIR gives."""
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside the path
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert f"(default: {tmp_path / 'runtime' / 'scheduler.key'}:" in capsys.readouterr().out


def test_slurm_controller_refuses_a_non_positive_interval(capsys):
    err = fails(["slurm-controller", "--policy", "easy", "--interval", "0"], capsys)
    assert err == "error: --interval must be above 0 seconds, got 0\n"


# -- dashboard-url ------------------------------------------------------------------------------

def test_dashboard_url_carries_the_token_of_the_key(tmp_path, no_key, capsys):
    key = tmp_path / "op.key"
    key.write_text("s3cret\n")
    assert main(["dashboard-url", "--dashboard", "8082", "--key-file", str(key)]) == 0
    assert capsys.readouterr().out == f"http://127.0.0.1:8082/?token={dashboard_token('s3cret')}\n"
    for written in ("::1:8082", "[::1]:8082"):  # bare, or in brackets as in a URL
        assert main(["dashboard-url", "--dashboard", written, "--key-file", str(key)]) == 0
        assert capsys.readouterr().out.startswith("http://[::1]:8082/?token=")


def test_dashboard_url_names_the_key_it_cannot_read(tmp_path, no_key, capsys):
    default = tmp_path / "runtime" / "scheduler.key"
    assert f"error: cannot read the operator's key {default}: " in fails(
        ["dashboard-url", "--dashboard", "8082"], capsys)
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    assert f"the key file {empty} is empty" in fails(
        ["dashboard-url", "--dashboard", "8082", "--key-file", str(empty)], capsys)


# -- report -------------------------------------------------------------------------------------

def test_report_names_a_missing_or_broken_event_log(tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    assert str(missing) in fails(["report", str(missing)], capsys)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(TWO_JOBS[0]) + "\n{oops\n")
    assert f"error: {broken}:2: not JSON" in fails(["report", str(broken)], capsys)
    listed = tmp_path / "list.jsonl"
    listed.write_text("[1, 2]\n")
    assert f"error: {listed}:1: an event must be a JSON object" in fails(["report", str(listed)], capsys)


def test_report_refuses_a_database_that_is_not_a_schedulers(tmp_path, capsys):
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    err = fails(["report", str(other)], capsys)
    assert f"error: {other}: not a scheduler database: no such table: events" in err


def test_report_writes_a_gantt_chart_and_a_page(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in TWO_JOBS))
    png, html = tmp_path / "g.png", tmp_path / "r.html"
    assert main(["report", str(log), "--gantt", str(png), "--html", str(html)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {html}" in captured.err and "max_overlap_violations" in captured.out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = html.read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html") and str(log) in page


class NoMatplotlib:
    """An import finder that finds no matplotlib, as if it were not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_a_chart_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in TWO_JOBS))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoMatplotlib(), *sys.meta_path])
    err = fails(["report", str(log), "--gantt", str(tmp_path / "g.png")], capsys)
    assert err == "error: plots need matplotlib; install it with: pip install 'apgas[bench]'\n"
    assert not (tmp_path / "g.png").exists()


# -- simulate and compare -----------------------------------------------------------------------

def test_simulate_names_an_unknown_policy_or_a_missing_trace(tmp_path, capsys):
    err = fails(["simulate", "--generate", "kit", "--nodes", "4", "--policy", "foo"], capsys)
    assert err.startswith("error: unknown policy 'foo'; known: fcfs, backfill, easy")
    err = fails(["compare", "--generate", "kit", "--nodes", "4", "--policies", "easy,,bar"], capsys)
    assert err.startswith("error: unknown policy 'bar'")
    missing = tmp_path / "none.swf"
    assert str(missing) in fails(["simulate", "--trace", str(missing), "--nodes", "4",
                                  "--policy", "easy"], capsys)


def test_simulate_says_which_jobs_it_left_out(capsys):
    assert main(["simulate", "--trace", TINY, "--nodes", "4", "--policy", "easy"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("2 job(s) simulated on 4 node(s) (3 left out: they need more than 4 node(s) "
                     "at --procs-per-node 1; 2 trace record(s) skipped: no run time or no "
                     "processors (cancelled or failed before they started))")
    assert main(["simulate", "--generate", "kit", "--jobs", "5", "--nodes", "1000",
                 "--policy", "fcfs"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "5 job(s) simulated on 1000 node(s)"


def test_compare_plots_its_runs(tmp_path, capsys):
    plot = tmp_path / "cmp.png"
    assert main(["compare", "--generate", "kit", "--jobs", "10", "--nodes", "16",
                 "--policies", "fcfs,easy", "--plot", str(plot)]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:4]]
    assert rows == ["fcfs", "easy"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the client commands ------------------------------------------------------------------------

@contextmanager
def stand_in(path: Path, replies: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """A scheduler on the Unix socket ``path`` that answers each request, in turn,
    with the next of ``replies``; yields the requests it got."""
    got: list[dict[str, Any]] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(10)

    def answer() -> None:
        for reply in replies:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n") and (chunk := conn.recv(65536)):
                    data += chunk
                got.append(json.loads(data))
                conn.sendall(json.dumps(reply).encode())

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        yield got
    finally:
        if thread.is_alive():  # a reply left unasked for: wake its accept
            try:
                server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.close()
        thread.join(10)
        path.unlink()


STATUS = {"ok": True, "policy": "easy", "time": 12.5,
          "nodes": [{"name": "n1", "job": None}, {"name": "n2", "job": 3},
                    {"name": "n3", "job": None, "down": True}],
          "jobs": [{"id": 3, "name": "sim", "class": "rigid", "state": "running", "nodes": ["n2"],
                    "reason": "", "requeues": 0}]}


def test_client_commands_print_what_the_scheduler_answered(tmp_path, capsys):
    sock = tmp_path / "s.sock"
    door = [*TO, "--socket", str(sock)]
    replies = [STATUS, STATUS, {"ok": True, "state": "cancelled"}, {"ok": True, "state": "queued"},
               {"ok": True, "nodes": ["n1", "n2", "n3", "n4"]}, {"ok": True, "down": []},
               {"ok": True, "down": ["n3"]}, {"ok": True}]
    with stand_in(sock, replies) as got:
        assert main(["status", *door]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0] == "policy easy, t = 12.5 s, 1/3 node(s) idle, 1 down: n3"
        assert table[2].split() == ["3", "sim", "rigid", "running", "n2", "-"]
        assert main(["status", *door, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {k: v for k, v in STATUS.items() if k != "ok"}
        for argv, out in ((["cancel", *door, "3"], "cancelled"), (["requeue", *door, "3"], "queued"),
                          (["add-nodes", *door, "n4"], "n1,n2,n3,n4"),
                          (["node-up", *door, "n3"], "still down: none"),
                          (["node-up", *door, "n[3-4]"], "still down: n3"),
                          (["shutdown", *door], "")):
            assert main(argv) == 0
            assert capsys.readouterr().out == (out + "\n" if out else "")
    assert [r["op"] for r in got] == ["status", "status", "cancel", "requeue", "add-nodes", "node-up",
                                      "node-up", "shutdown"]
    assert got[2]["id"] == 3 and got[4]["nodes"] == ["n4"] and got[6]["nodes"] == ["n3", "n4"]


def test_a_refusal_is_printed_with_exit_code_1(tmp_path, capsys):
    sock = tmp_path / "s.sock"
    with stand_in(sock, [{"ok": False, "error": "no job 42"}]):
        assert fails(["cancel", *TO, "--socket", str(sock), "42"], capsys, 1) == "error: no job 42\n"


def test_a_missing_or_false_socket_is_named(tmp_path, capsys):
    missing = tmp_path / "gone.sock"
    err = fails(["status", *TO, "--socket", str(missing)], capsys, 1)
    assert err.startswith(f"error: cannot reach the scheduler at {missing}: ")
    plain = tmp_path / "plain"
    plain.write_text("")
    err = fails(["status", *TO, "--socket", str(plain)], capsys, 1)
    assert err == f"error: refusing to talk to {plain}: it is not a socket\n"


def test_a_client_without_key_or_socket_says_how_to_get_in(tmp_path, no_key, capsys):
    err = fails(["status", "--to", "127.0.0.1:1"], capsys, 1)
    assert err.startswith("error: no way in to the scheduler at 127.0.0.1:1: cannot read the "
                          f"operator's key {tmp_path / 'runtime' / 'scheduler.key'}")
    assert err.endswith("; give --key-file or --socket\n")


def test_an_unreadable_key_file_is_named(tmp_path, capsys):
    key = tmp_path / "none.key"
    assert fails(["status", *TO, "--key-file", str(key)], capsys).startswith(
        f"error: cannot read the key file {key}: ")


def job_file(path: Path) -> str:
    path.write_text('name = "j"\ncommand = "true"\nclass = "rigid"\nnodes = 1\nwalltime = 10\n')
    return str(path)


def test_submit_goes_on_after_a_bad_file_and_names_each(tmp_path, capsys):
    sock = tmp_path / "s.sock"
    good, other = job_file(tmp_path / "a.toml"), job_file(tmp_path / "b.toml")
    missing = str(tmp_path / "missing.toml")
    replies = [{"ok": True, "id": 7}, {"ok": False, "error": "too many nodes"}]
    with stand_in(sock, replies) as got:
        assert main(["submit", *TO, "--socket", str(sock), good, missing, other]) == 2
    captured = capsys.readouterr()
    assert captured.out == "7\n"
    assert f"error: {missing}: cannot read" in captured.err
    assert f"error: {other}: too many nodes\n" in captured.err
    assert [(r["op"], r["job"]["name"]) for r in got] == [("submit", "j"), ("submit", "j")]
    assert got[0]["request"] != got[1]["request"]  # one request key per file
    with stand_in(sock, [{"ok": False, "error": "too many nodes"}]):
        assert main(["submit", *TO, "--socket", str(sock), good]) == 1
    assert capsys.readouterr().err == f"error: {good}: too many nodes\n"


def test_submit_to_an_unreachable_scheduler_names_the_files_not_sent(tmp_path, capsys):
    files = [job_file(tmp_path / "a.toml"), job_file(tmp_path / "b.toml")]
    missing = tmp_path / "gone.sock"
    err = fails(["submit", *TO, "--socket", str(missing), *files], capsys, 1)
    assert err.startswith(f"error: cannot reach the scheduler at {missing}: ")
    assert err.endswith(f"; not submitted: {files[0]}, {files[1]}\n")
