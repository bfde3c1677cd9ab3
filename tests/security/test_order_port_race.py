"""Issue 40, item 5: the order-port race. A malleable job's order port used to be
``27100 + its id``, shown in the world-readable ``status`` before the job bound
it; the user ``nobody`` bound it first and root's job failed at its start
(``cannot listen for orders on 127.0.0.1:27110 ... Address already in use``).

Now a job started with the signed protocol binds a port the kernel gives it and
names it in its signed ready line; the scheduler shows and uses no port before
that line. Each test acts as ``nobody`` (the system Python, no apgas) against a
root scheduler serving every user (``--socket-mode 666``):

1. nobody binds every order port it can predict (the fixed range from the next
   job's id on) and, the moment ``status`` shows one, that one too; root's
   malleable job still starts, reports ready and is grown by the scheduler;
2. nobody sends ready lines naming its own port, unsigned, without a job id,
   and signed with a key of its own, before and after the job's real one; the
   job's orders still reach the job, and nothing reaches nobody's port.

The tests after them need no root: the ready line as the protocol builds and
parses it, as each kind of job sends it, and as the scheduler takes it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import eventually
from test_authentication import SYSTEM_PY

import apgas
from apgas import auth, protocol
from apgas.testing import FakeScheduler
from apgas_scheduler.jobs import JobSpec

pytestmark = pytest.mark.timeout(90)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacks come from the "
                                                       "user nobody against a root scheduler")
ROOT = Path(__file__).resolve().parents[2]

# nobody's side: plain sockets and the system Python (nobody cannot read the project's)
ATTACKER = r'''
import hashlib, hmac, json, os, secrets, socket, sys, time
unix, host, port, base, out, stop, mode = sys.argv[1:8]
scheduler, base = (host, int(port)), int(base)
held, seen, heard, sent = {}, {}, [], {"before_ready": 0, "after_ready": 0}

def status():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(unix)
        s.sendall(b'{"op": "status"}\n')
        return json.loads(s.makefile().readline())
    finally:
        s.close()

def squat(host, port):
    if port in held:
        return
    s = socket.socket()
    try:
        s.bind((host, port))
        s.listen()
        held[port] = s
    except OSError:
        s.close()

def tell(line):
    try:
        with socket.create_connection(scheduler, timeout=2) as c:
            c.sendall(line.encode() + b"\n")
    except OSError:
        pass

def forged(line):  # signed, but with a key of nobody's own
    t, nonce = time.time_ns(), secrets.token_hex(8)
    mac = hmac.new(b"not the job's key", f"{t} {nonce} {line}".encode(), hashlib.sha256)
    return f"A1 {t} {nonce} {mac.hexdigest()[:32]} {line}"

mine = socket.create_server(("127.0.0.1", 0))  # where nobody wants the orders to go
mine.setblocking(False)
me = mine.getsockname()[1]
if mode == "squat":
    first = len(status()["jobs"]) + 1  # the next job's id
    for k in range(60):  # its would-be port and those after it (the range skips taken ones)
        squat("127.0.0.1", base + first + k)
open(out + ".armed", "w").close()
deadline = time.monotonic() + 80
while not os.path.exists(stop) and time.monotonic() < deadline:
    for job in status().get("jobs", []):
        if job["listen"] and job["id"] not in seen:  # first sight of its port
            seen[job["id"]] = [job["listen"], job["ready"]]
        if mode == "squat" and job["listen"]:
            where, _, p = job["listen"].rpartition(":")
            squat(where, int(p))
        if mode == "forge" and job["state"] == "running":
            for line in (f"APGAS-Ready;{me}:127.0.0.1:{job['id']}", f"APGAS-Ready;{me}:127.0.0.1"):
                tell(line)
                tell(forged(line))
            sent["after_ready" if job["ready"] else "before_ready"] += 1
    try:
        conn, _ = mine.accept()
        conn.settimeout(2)
        heard.append(conn.makefile().readline())
        conn.close()
    except (BlockingIOError, OSError):
        pass
    time.sleep(0.01)
with open(out, "w") as f:
    json.dump({"held": sorted(held), "seen": seen, "heard": heard, "sent": sent, "port": me}, f)
'''

# root's malleable job: registers a handler, waits for the scheduler's grow, ends
PROGRAM = '''
import sys, threading
import apgas

grown = threading.Event()


class Handler(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]

    def post_grow(self, n, continued, added):
        print(f"GROWN {len(apgas.places())}", flush=True)
        grown.set()


def main():
    print("LISTEN {}:{}".format(*apgas.define_malleable_handler(Handler()).address), flush=True)
    grown.wait(60)
    apgas.disable_malleable_handler()


apgas.run(main)
sys.exit(0 if grown.is_set() else 3)
'''


@pytest.fixture
def shared_sched(make_scheduler):
    """A root scheduler every user may use, with two nodes: a malleable job of one
    is grown onto the second."""
    return make_scheduler(nodes=2, policy="malleable", socket_mode=0o666)


class Attacker:
    """``nobody``'s process against ``sched`` (mode ``squat`` or ``forge``)."""

    def __init__(self, sched, shared_dir: Path, mode: str) -> None:
        self.out, self.stop_file = shared_dir / f"{mode}.json", shared_dir / f"{mode}.stop"
        self.proc = subprocess.Popen(
            [SYSTEM_PY, "-c", ATTACKER, str(sched.socket_path), *map(str, sched.address),
             str(sched.order_port_base), str(self.out), str(self.stop_file), mode],
            user="nobody", cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        eventually(lambda: Path(f"{self.out}.armed").exists() or self.proc.poll() is not None,
                   "nobody to be ready", timeout=30)
        assert self.proc.poll() is None, self.proc.communicate()

    def finish(self) -> dict:
        self.stop_file.touch()
        try:
            _, err = self.proc.communicate(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.returncode == 0, err
        return json.loads(self.out.read_text())


def malleable_job(tmp_path: Path) -> JobSpec:
    program = tmp_path / "malleable_job.py"
    program.write_text(textwrap.dedent(PROGRAM))
    return JobSpec("m", ("python", str(program)), "malleable", 1, 2, 60,
                   (("PYTHONPATH", str(ROOT)),), str(ROOT))  # this checkout's apgas, as the scheduler's


def ended(sched, job_id: int) -> dict:
    def state():
        job = next(j for j in sched.status()["jobs"] if j["id"] == job_id)
        return job if job["state"] not in ("queued", "running") else None
    return eventually(state, f"job {job_id} to end", timeout=70)


def outputs(tmp_path: Path, job_id: int) -> tuple[str, str]:
    return tuple((tmp_path / "out" / f"job-{job_id}.{k}").read_text()  # type: ignore[return-value]
                 for k in ("out", "err"))


@as_root
def test_nobody_cannot_take_a_malleable_jobs_order_port_first(shared_sched, shared_dir, tmp_path):
    attacker = Attacker(shared_sched, shared_dir, "squat")
    try:
        job_id = shared_sched.submit(malleable_job(tmp_path))
        job = ended(shared_sched, job_id)
    finally:
        seen = attacker.finish()
    out, err = outputs(tmp_path, job_id)
    assert seen["held"], "nobody held no order port: the attack did not happen"
    assert job["state"] == "done", (job["state"], job["reason"], err.strip().splitlines()[-1:])
    assert "Address already in use" not in err
    assert job["grows"] >= 1 and "GROWN 2" in out, (job, out)  # the scheduler's grow reached it
    assert job["listen"] and f"LISTEN {job['listen']}" in out  # where the job listened itself
    listen, ready = seen["seen"][str(job_id)]
    assert (listen, ready) == (job["listen"], True), "status showed a port before the ready line"


@as_root
def test_a_forged_ready_line_does_not_redirect_orders(shared_sched, shared_dir, tmp_path):
    attacker = Attacker(shared_sched, shared_dir, "forge")
    try:
        job_id = shared_sched.submit(malleable_job(tmp_path))
        eventually(lambda: next(j for j in shared_sched.status()["jobs"]
                                if j["id"] == job_id)["grows"] >= 1, "the grow", timeout=60)
        time.sleep(0.5)  # a few forged lines after the job's own ready line, too
        job = ended(shared_sched, job_id)
    finally:
        forged = attacker.finish()
    out, err = outputs(tmp_path, job_id)
    assert forged["sent"]["before_ready"] and forged["sent"]["after_ready"], forged
    assert job["state"] == "done" and "GROWN 2" in out, (job, out, err[-2000:])
    assert job["listen"] != f"127.0.0.1:{forged['port']}"
    assert f"LISTEN {job['listen']}" in out
    assert forged["heard"] == [], "an order went to nobody's port"


# -- without root ----------------------------------------------------------------------

def test_the_ready_line_names_the_port_and_stays_of_kind_ready():
    assert protocol.ready() == protocol.READY == "APGAS-Ready"
    assert protocol.ready(40123) == "APGAS-Ready;40123"
    for line, port in [("APGAS-Ready:10.0.0.1:3", None), ("APGAS-Ready;40123:10.0.0.1:3", 40123)]:
        message = protocol.parse_message(line)
        assert (message.kind, protocol.ready_port(message)) == ("ready", port)
    for bad in ("APGAS-Ready;0", "APGAS-Ready;65536", "APGAS-Ready;x", "APGAS-Ready;-1"):
        with pytest.raises(ValueError, match="port must be a number in 1..65535"):
            protocol.ready_port(protocol.parse_message(f"{bad}:10.0.0.1:3"))
    assert protocol.parse_message("APGAS-Ready;1;2:10.0.0.1").kind == "other"
    assert protocol.ejs_knows("APGAS-Ready") and not protocol.ejs_knows("APGAS-Ready;40123")
    with pytest.raises(ValueError):
        protocol.ready(0)


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


@pytest.mark.parametrize("job_id, plain, names_port", [
    ("5", False, True),    # our scheduler's signed job: the port it bound
    ("", True, False),     # the ElasticJobScheduler's dialect: the bare line
    ("5", True, False),    # our scheduler's plain job: the fixed port it was given
    ("", False, False),    # started by hand
])
def test_which_jobs_name_their_port_in_the_ready_line(monkeypatch, job_id, plain, names_port):
    secret = auth.new_secret() if job_id and not plain else ""  # given by our scheduler
    fake = FakeScheduler(secret=secret or None)
    for name, value in {"APGAS_SCHEDULER": "{}:{}".format(*fake.address), "APGAS_JOB_ID": job_id,
                        "APGAS_MALLEABLE_LISTEN": "127.0.0.1:0", "APGAS_LOCAL_HOSTS": "*",
                        "APGAS_PLAIN_PROTOCOL": "1" if plain else "",
                        "APGAS_JOB_SECRET": secret}.items():
        monkeypatch.setenv(name, value) if value else monkeypatch.delenv(name, raising=False)
    seen = {}

    def main():
        port = apgas.define_malleable_handler(Newest()).address[1]
        seen["line"], seen["port"] = fake.take(protocol.READY, timeout=10).line, port
        if names_port:  # the FakeScheduler orders the job where the line says
            fake.later(protocol.STATUS)
            fake.join()

    try:
        apgas.run(main, places=1)
    finally:
        fake.close()
    sender = "127.0.0.1" + (f":{job_id}" if job_id else "")
    if names_port:
        assert seen["line"] == f"APGAS-Ready;{seen['port']}:{sender}"
        assert fake.reported == ("127.0.0.1", seen["port"])
        assert fake.replies[0][0].startswith("status malleable 1")
    else:
        assert seen["line"] == f"APGAS-Ready:{sender}" and fake.reported is None


def test_the_scheduler_takes_the_port_only_from_a_signed_ready_line_that_names_it(
        make_scheduler, tmp_path):
    """A signed job is told port 0 and shows no port until its signed ready line
    names one: a bare or malformed ready line leaves it not ready, an unsigned one
    is refused; then its orders go to the port the line named."""
    sched = make_scheduler(nodes=2, policy="malleable")
    log = tmp_path / "stand-in.jsonl"
    job_id = sched.submit(JobSpec("m", ("python", str(ROOT / "tests" / "evolving_job.py")),
                                  "malleable", 1, 2, 60, (("FAKE_LOG", str(log)),), str(ROOT)))
    first = eventually(lambda: log.exists() and log.read_text().splitlines()[:1], "the job to listen")
    port = json.loads(first[0])["port"]

    def state():
        return next(j for j in sched.status()["jobs"] if j["id"] == job_id)

    def send(line: str, signed: bool = True) -> None:
        with socket.create_connection(sched.address, timeout=10) as conn:
            text = auth.sign(sched._jobs[job_id].secret, line) if signed else line
            conn.sendall(text.encode() + b"\n")

    send(f"APGAS-Ready:127.0.0.1:{job_id}")  # signed, but no port
    send(f"APGAS-Ready;99999:127.0.0.1:{job_id}")
    send(f"APGAS-Ready;{port + 1}:127.0.0.1:{job_id}", signed=False)
    time.sleep(1.0)
    assert (state()["ready"], state()["listen"]) == (False, None)
    send(f"APGAS-Ready;{port}:127.0.0.1:{job_id}")
    eventually(lambda: state()["grows"] >= 1, "the grow order")
    assert state()["listen"] == f"127.0.0.1:{port}"
    assert [json.loads(line)["order"] for line in log.read_text().splitlines()][1:] == \
        ["grow 1 node1"]
    sched.shutdown()
