"""Issue 16's attacks on the scheduler and on jobs' order ports, each refused with
the system still serving: unsigned or replayed requests, other users, spoofed and
replayed job messages, unsigned and replayed orders; and the compatibility mode."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually
from launch_prog import Newest

import apgas
from apgas import auth
from apgas.order import send_order
from apgas_scheduler.client import request
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live import access

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PY = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def sched(make_scheduler):
    return lambda **options: make_scheduler(nodes=3, policy="fcfs", **options)


def raw(address, line: str | bytes) -> str:
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall((line if isinstance(line, bytes) else line.encode()) + b"\n")
        return conn.makefile().readline().strip()


def as_nobody(unix_path: Path, req: dict) -> dict:
    """Send a request over the Unix socket as the user nobody (system Python, no apgas)."""
    code = ("import json, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1])\n"
            "except OSError as e:\n    print(json.dumps({'ok': False, 'connect': str(e)})); sys.exit()\n"
            "s.sendall(sys.argv[2].encode() + b'\\n')\n"
            "print(s.makefile().readline())\n")
    out = subprocess.run([SYSTEM_PY, "-c", code, str(unix_path), json.dumps(req)], user="nobody",
                         capture_output=True, text=True, timeout=30, cwd="/")
    return json.loads(out.stdout)


def marker_job(path: Path, name: str = "m") -> dict:
    return {"name": name, "command": ["/bin/sh", "-c", f"id -u > {path}; sleep 30"],
            "class": "rigid", "nodes": 1, "walltime": 60, "cwd": str(path.parent)}


# -- the scheduler's clients -----------------------------------------------------------

def test_an_unsigned_submit_over_tcp_runs_nothing(sched, shared_dir):
    s = sched()
    marker = shared_dir / "pwned"
    reply = json.loads(raw(s.address, json.dumps({"op": "submit", "job": marker_job(marker)})))
    assert not reply["ok"] and "unsigned request refused" in reply["error"]
    for op in ("cancel", "shutdown"):
        assert not json.loads(raw(s.address, json.dumps({"op": op, "id": 1})))["ok"]
    time.sleep(0.5)
    assert not marker.exists() and s.status()["jobs"] == []
    assert request(s.address, "status")["ok"]  # signed with the operator's key: served


def test_a_request_signed_with_another_key_or_replayed_is_refused(sched):
    s = sched()
    forged = auth.sign(auth.new_secret(), json.dumps({"op": "shutdown"}))
    assert "bad signature" in json.loads(raw(s.address, forged))["error"]
    key = auth.read_secret(access.default_key_file())
    status = auth.sign(key, json.dumps({"op": "status"}))
    assert json.loads(raw(s.address, status))["ok"]
    assert "replayed" in json.loads(raw(s.address, status))["error"]
    stale = status.split(" ", 4)
    stale[1] = str(time.time_ns() - 3600 * 10**9)  # an hour old (and so a bad MAC too)
    assert not json.loads(raw(s.address, " ".join(stale)))["ok"]
    assert request(s.address, "status")["ok"]


@pytest.mark.skipif(not AS_ROOT, reason="needs root to act as another user")
def test_other_users_cannot_reach_an_operator_only_socket(sched):
    s = sched()
    reply = as_nobody(s.socket_path, {"op": "status"})
    assert "Permission denied" in reply["connect"]


@pytest.mark.skipif(not AS_ROOT, reason="needs root to act as another user")
def test_another_user_submits_jobs_that_run_as_that_user_and_cannot_touch_others(
        sched, shared_dir):
    s = sched(socket_mode=0o666)
    theirs, mine = shared_dir / "theirs", shared_dir / "mine"
    reply = as_nobody(s.socket_path, {"op": "submit", "job": marker_job(theirs, "theirs")})
    assert reply["ok"], reply
    assert eventually(lambda: theirs.exists() and theirs.read_text().strip(), "nobody's job") == "65534"
    my_id = request(s.address, "submit", job=marker_job(mine, "mine"))["id"]
    eventually(lambda: mine.exists() and mine.read_text().strip(), "the operator's job")
    assert mine.read_text().strip() == str(os.geteuid())
    refused = as_nobody(s.socket_path, {"op": "cancel", "id": my_id})
    assert not refused["ok"] and "only their own jobs" in refused["error"]
    for op in ("shutdown", "add-nodes"):
        refused = as_nobody(s.socket_path, {"op": op, "nodes": ["x"]})
        assert not refused["ok"] and "for the scheduler's operator" in refused["error"]
    assert as_nobody(s.socket_path, {"op": "cancel", "id": reply["id"]})["ok"]  # their own
    jobs = {j["id"]: j for j in request(s.address, "status")["jobs"]}
    assert jobs[my_id]["state"] == "running" and jobs[reply["id"]]["owner"] == 65534


def test_the_cli_finds_its_credentials_without_flags(sched, tmp_path):
    s = sched()
    run = [sys.executable, "-m", "apgas_scheduler"]
    out = subprocess.run([*run, "status", "--to", "{}:{}".format(*s.address), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["policy"] == "fcfs"
    # without the key file, the Unix socket of that port is the way in
    env = {**os.environ, "APGAS_RUNTIME_DIR": str(tmp_path / "elsewhere")}
    out = subprocess.run([*run, "status", "--to", "{}:{}".format(*s.address)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# -- jobs' messages ----------------------------------------------------------------------

def test_spoofed_and_replayed_job_messages_change_nothing(sched, shared_dir):
    s = sched()
    a = request(s.address, "submit", job=marker_job(shared_dir / "a", "a"))["id"]
    b = request(s.address, "submit", job=marker_job(shared_dir / "b", "b"))["id"]
    eventually(lambda: all(j["state"] == "running" for j in s.status()["jobs"]), "both jobs to run")
    node_of_a = next(n["name"] for n in s.status()["nodes"] if n["job"] == a)
    release = f"Evolving;Release;{node_of_a}:127.0.0.1:{a}"
    raw(s.address, release)                                         # unsigned
    raw(s.address, auth.sign(s._jobs[b].secret, release))           # b speaking for a
    raw(s.address, auth.sign(s._jobs[a].secret, release))           # a rigid job's own release
    request_a = auth.sign(s._jobs[a].secret, f"Evolving;Request;1:127.0.0.1:{a}")
    first = raw(s.address, request_a)
    assert first.startswith("error policy fcfs")                    # a's own ask: answered
    assert "replayed" in raw(s.address, request_a)                  # the same line again
    assert next(n["job"] for n in s.status()["nodes"] if n["name"] == node_of_a) == a
    assert request(s.address, "status")["ok"]


def test_plain_jobs_only_with_the_compatibility_option(sched, tmp_path):
    strict = sched()
    job = JobSpec("j", ("/bin/true",), "malleable", 1, 2, 10.0, (), str(ROOT), "plain")
    with pytest.raises(ValueError, match="--allow-plain-jobs"):
        strict.submit(job)
    loose = sched(allow_plain_jobs=True, socket_path=tmp_path / "loose.sock")
    assert loose.submit(job) >= 1


# -- orders to a job ---------------------------------------------------------------------

def test_unsigned_forged_and_replayed_orders_are_refused(monkeypatch):
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "127.0.0.1:0")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        unsigned = send_order(address, "grow 2 nodeA nodeB", secret="")
        forged = send_order(address, "grow 2 nodeA nodeB", secret=auth.new_secret())
        key = auth.read_secret(auth.order_key_path(address[1]))
        signed = auth.sign(key, "grow 1 nodeA")
        first = send_order(address, signed.encode())
        again = send_order(address, signed.encode())
        status = send_order(address, "status")  # the key file: found by this user
        return unsigned, forged, first, again, status, len(apgas.places())

    unsigned, forged, first, again, status, places = apgas.run(main, places=1)
    assert unsigned[0].startswith("error this job takes signed orders only")
    assert forged[0].startswith("error bad signature")
    assert first == ["ok grow 1 places 1"]
    assert again[0].startswith("error replayed line refused")
    assert status[0] == "status malleable 2" and places == 2


def test_the_order_cli_signs_with_the_jobs_key_file(monkeypatch):
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "127.0.0.1:0")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        to = "{}:{}".format(*address)
        cli = [sys.executable, "-m", "apgas.order", "--to", to]
        signed = subprocess.run([*cli, "status"], capture_output=True, text=True, timeout=60)
        plain = subprocess.run([*cli, "--plain", "status"], capture_output=True, text=True,
                               timeout=60)
        return signed.returncode, signed.stdout, plain.returncode, plain.stdout

    code, out, plain_code, plain_out = apgas.run(main, places=1)
    assert code == 0 and out.startswith("status malleable 1")
    assert plain_code == 1 and "signed orders only" in plain_out


def test_the_job_key_goes_over_ssh_stdin_not_the_command_line(sshd):
    from launcher.ssh import SshLauncher

    class Config:
        ssh = " ".join(sshd.command)

    launcher = SshLauncher(Config())
    secret = {"APGAS_JOB_SECRET": auth.new_secret()}
    argv = launcher.command("sshhost1", [sys.executable, "-c",
                                         "import os; print(os.environ['APGAS_JOB_SECRET'])"],
                            {"X": "1"}, secret_names=list(secret))
    assert secret["APGAS_JOB_SECRET"] not in " ".join(argv)
    stdin = launcher.secret_input("sshhost1", secret)
    out = subprocess.run(argv, input=stdin, capture_output=True, timeout=60)
    assert out.stdout.decode().strip() == secret["APGAS_JOB_SECRET"], out.stderr
    assert launcher.secret_input("localhost", secret) is None  # local: the environment carries it


def test_malformed_requests_get_clear_errors_and_the_scheduler_goes_on(sched, shared_dir):
    """The deep JSON, infinite walltime and 1000-digit count of issue 16, signed by the
    operator so that they reach the parser."""
    s = sched()
    key = auth.read_secret(access.default_key_file())
    deep = '{"op": "submit", "job": ' + "[" * 200_000 + "]" * 200_000 + "}"
    assert "nested deeper than" in json.loads(raw(s.address, auth.sign(key, deep)))["error"]
    job = marker_job(shared_dir / "never")
    for key_name, value, words in (("walltime", "Infinity", "Infinity"),
                                   ("max_nodes", "9" * 1000, "digits")):
        line = json.dumps({"op": "submit", "job": {**job, "class": "moldable"}})
        line = line.replace('"nodes": 1', f'"min_nodes": 1, "{key_name}": {value}', 1) \
            if key_name == "max_nodes" else line.replace('"walltime": 60', f'"walltime": {value}')
        reply = json.loads(raw(s.address, auth.sign(key, line)))
        assert not reply["ok"] and words in reply["error"], reply
    assert request(s.address, "status")["jobs"] == []


def test_a_job_in_plain_mode_takes_plain_orders_and_says_so(monkeypatch, apgas_caplog):
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "127.0.0.1:0")
    monkeypatch.setenv("APGAS_PLAIN_PROTOCOL", "1")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        return send_order(address, "grow 1 nodeA", secret=""), len(apgas.places())

    with apgas_caplog.at_level("WARNING", logger="apgas.malleable"):
        reply, places = apgas.run(main, places=1)
    assert reply == ["ok grow 1 places 1"] and places == 2
    assert "anyone who can reach that port can resize this job" in apgas_caplog.text
