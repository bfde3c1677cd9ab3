"""Issue 28: a root scheduler shared by the users of a machine (``--socket-mode 666``)
that no local user can turn against root or another user. Each test tries one
attack as the user ``nobody`` and shows it fail, with what the scheduler says:

1. a job's ``env`` (``LD_PRELOAD``, ``LD_AUDIT``) reaching a process that is still root;
2. a planted state directory (a queued job "of root's");
3. a planted output file (a link to root's file);
4. a key file someone else owns;
5. a squatted socket or port, the client sending its job there;
9. an oracle on root's files (the error of a job that cannot start).

(6-8, floods and the log, are in ``test_fair_service.py``.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import eventually
from orders import free_address
from test_authentication import SYSTEM_PY, as_nobody

from apgas import auth
from apgas.serving import UntrustedPath
from apgas_scheduler.client import SchedulerError, request
from apgas_scheduler.jobs import parse_job
from apgas_scheduler.live import access
from apgas_scheduler.live.records import Job
from apgas_scheduler.live.state import StateStore

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacks come from "
                                                           "the user nobody against a root scheduler")]
NOBODY = 65534
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_sched(make_scheduler):
    return lambda **options: make_scheduler(nodes=2, policy="fcfs", socket_mode=0o666, **options)


def ended(sched, job_id: int) -> dict:
    def state():
        job = next(j for j in sched.status()["jobs"] if j["id"] == job_id)
        return job if job["state"] not in ("queued", "running") else None
    return eventually(state, f"job {job_id} to end", timeout=30)


def submit_as_nobody(sched, job: dict) -> int:
    reply = as_nobody(sched.socket_path, {"op": "submit", "job": job})
    assert reply.get("ok"), reply
    return reply["id"]


# -- 1. nothing of the job reaches a root process -------------------------------------------

MARKER_LIB = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
unsigned int la_version(unsigned int version) { return version; }  /* a valid LD_AUDIT module */
__attribute__((constructor)) static void mark(void) {
    const char *dir = getenv("MARK_DIR");
    char path[4096];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/euid-%d-pid-%d", dir, (int)geteuid(), (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}
"""


@pytest.fixture(scope="module")
def marker_lib():
    """A shared library whose constructor leaves a file named after the euid it runs with."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc or gcc) to build the library of the attack")
    work = Path(tempfile.mkdtemp(prefix="apgas-lib-"))
    work.chmod(0o755)
    (work / "mark.c").write_text(MARKER_LIB)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(work / "mark.so"), str(work / "mark.c")],
                   check=True, capture_output=True, timeout=60)
    (work / "mark.so").chmod(0o755)
    yield work / "mark.so"
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("variable", ["LD_PRELOAD", "LD_AUDIT"])
@pytest.mark.parametrize("cgroups", ["1", "0"], ids=["cgroup", "no-cgroup"])
def test_a_jobs_loader_variables_act_only_as_its_user(shared_sched, shared_dir, marker_lib, variable,
                                                       cgroups, monkeypatch):
    monkeypatch.setenv("APGAS_SCHEDULER_CGROUPS", cgroups)
    s = shared_sched()
    job_id = submit_as_nobody(s, {"name": "innocent", "command": ["/bin/true"], "class": "rigid",
                                  "nodes": 1, "walltime": 30, "cwd": str(shared_dir),
                                  "env": {variable: str(marker_lib), "MARK_DIR": str(shared_dir)}})
    assert ended(s, job_id)["state"] == "done"
    marks = sorted(p.name for p in shared_dir.glob("euid-*"))
    assert marks, f"{variable} never loaded: the attack was not tried"  # the user's /bin/true did
    assert all(m.startswith(f"euid-{NOBODY}-") for m in marks), \
        f"the job's {variable} ran with another euid: {marks}"


def test_the_first_process_of_a_job_sees_nothing_of_the_job(tmp_path):
    """What the scheduler starts as root has a fixed environment; the job's comes after the switch."""
    from apgas_scheduler.live import containment

    out = tmp_path / "environ"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o644)
    user = containment.RunAs(NOBODY, NOBODY, (NOBODY,))
    try:
        h = containment.start(1, ["/bin/sh", "-c", "id -u; echo $SECRET; pwd"], cwd="/",
                              env={"PATH": "/usr/bin:/bin", "SECRET": "s3", "LD_PRELOAD": ""},
                              user=user, stdout=fd, cgroup=False)
    finally:
        os.close(fd)
    assert h.proc.wait(10) == 0
    assert out.read_text().split() == [str(NOBODY), "s3", "/"]
    assert "LD_PRELOAD" not in containment._EXEC_ENV and set(containment._EXEC_ENV) == {"PATH"}


# -- 2. a planted state directory -------------------------------------------------------------

def plant_state(directory: Path) -> None:
    """A state database holding a queued job recorded as root's, as an attacker would write it."""
    store = StateStore(directory)
    spec = parse_job({"name": "planted", "command": ["/bin/sh", "-c", "id -u > /tmp/planted-ran"],
                      "class": "rigid", "nodes": 1, "walltime": 30}, "planted")
    store.record({"t": 0, "event": "submit", "job": 1}, job=Job(1, spec, 0.0, owner=0))
    store.close()


@pytest.mark.parametrize("how", ["owned by nobody", "writable by all", "under a writable directory"])
def test_a_planted_state_directory_is_refused(shared_dir, make_scheduler, how):
    state = shared_dir / ("parent" if how == "under a writable directory" else "") / "scheduler-jobs.state"
    state.parent.mkdir(exist_ok=True)
    plant_state(state)
    if how == "owned by nobody":
        for p in [state, *state.iterdir()]:
            os.chown(p, NOBODY, NOBODY)
        state.chmod(0o777)
        said = [str(state), "nobody (uid 65534)", "belongs to another user"]
    elif how == "writable by all":
        state.chmod(0o777)
        said = [str(state), "mode 0777", "may be written by others"]
    else:
        state.parent.chmod(0o777)  # shared: anybody may swap the directory in it
        said = [str(state.parent), "a directory above", "may be written by others"]
    with pytest.raises(UntrustedPath) as refused:
        make_scheduler(nodes=1, policy="fcfs", state_dir=state)
    assert all(s in str(refused.value) for s in said), str(refused.value)
    assert not Path("/tmp/planted-ran").exists()


def test_serve_says_what_is_wrong_with_the_state_directory(shared_dir, tmp_path):
    state = shared_dir / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    out = subprocess.run([sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", "n0",
                          "--port", "0", "--state-dir", str(state), "--output-dir",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2
    assert f"the state directory: {state}" in out.stderr and "mode 0777" in out.stderr, out.stderr


# -- 3. a planted output directory ------------------------------------------------------------

def test_an_output_directory_others_may_write_is_refused(shared_dir, make_scheduler):
    with pytest.raises(UntrustedPath, match="the output directory.*mode 1777.*may be written"):
        make_scheduler(nodes=1, policy="fcfs", output_dir=shared_dir)


def test_planted_links_in_the_output_directory_are_replaced_not_followed(shared_sched, shared_dir,
                                                                        tmp_path):
    s = shared_sched(output_dir=shared_dir / "out")  # in a sticky directory, as /tmp is
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    next_id = s.core.store.last_id() + 1
    (s.output_dir / f"job-{next_id}.out").symlink_to(victim)  # as if planted earlier
    os.link(victim, s.output_dir / f"job-{next_id}.err")
    job_id = submit_as_nobody(s, {"name": "out", "command": ["/bin/sh", "-c", "echo hello; echo oops >&2"],
                                  "class": "rigid", "nodes": 1, "walltime": 30, "cwd": "/"})
    assert job_id == next_id
    assert ended(s, job_id)["state"] == "done"
    assert victim.read_text() == "precious\n" and victim.stat().st_uid == 0
    out, err = s.output_dir / f"job-{job_id}.out", s.output_dir / f"job-{job_id}.err"
    assert not out.is_symlink() and out.read_text() == "hello\n" and err.read_text() == "oops\n"
    assert out.stat().st_uid == NOBODY and (out.stat().st_mode & 0o777) == 0o600
    assert (s.output_dir.stat().st_mode & 0o777) == 0o711  # each user opens their own by name
    read = subprocess.run(["/bin/cat", str(out)], user="nobody", capture_output=True, text=True)
    assert read.stdout == "hello\n"


# -- 4. a key file someone else owns ----------------------------------------------------------

def test_a_key_file_someone_else_owns_is_refused(shared_dir, make_scheduler):
    keys = shared_dir / "keys"
    keys.mkdir(mode=0o700)
    key = keys / "scheduler.key"
    key.write_text(auth.new_secret() + "\n")
    key.chmod(0o600)
    os.chown(key, NOBODY, NOBODY)  # the attacker's file, mode 0600: it knows the key
    with pytest.raises(UntrustedPath, match=r"the key file: .* nobody \(uid 65534\).*belongs to another"):
        make_scheduler(nodes=1, policy="fcfs", key_file=key)
    os.chown(key, 0, 0)
    os.chown(keys, NOBODY, NOBODY)  # root's key in nobody's directory: nobody could swap it
    with pytest.raises(UntrustedPath, match="a directory above"):
        make_scheduler(nodes=1, policy="fcfs", key_file=key)


def test_serve_refuses_a_foreign_key_file_with_a_clear_error(shared_dir, tmp_path):
    key = tmp_path / "scheduler.key"
    key.write_text(auth.new_secret() + "\n")
    key.chmod(0o600)
    os.chown(key, NOBODY, NOBODY)
    out = subprocess.run([sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", "n0",
                          "--port", "0", "--key-file", str(key), "--output-dir",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "nobody (uid 65534)" in out.stderr, out.stderr


# -- 5. a squatted socket or port -------------------------------------------------------------

SQUATTER = textwrap.dedent("""
    import json, os, socket, sys
    kind, where, record = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.bind(where)
        os.chmod(where, 0o777)
    else:
        s = socket.create_server(("127.0.0.1", int(where)))
    s.listen(8)
    print("listening", flush=True)
    while True:
        conn, _ = s.accept()
        try:
            data = conn.recv(1 << 20)
            with open(record, "ab") as f:
                f.write(data)
            conn.sendall(json.dumps({"ok": True, "id": 99}).encode() + b"\\n")
        except OSError:
            pass
        conn.close()
""")


@pytest.fixture
def squatter(shared_dir):
    """Listen as nobody (on a Unix socket path or a loopback port) and keep what comes."""
    started = []

    def start(kind: str, where: str) -> Path:
        record = shared_dir / f"got-{len(started)}"
        record.touch()
        record.chmod(0o666)
        proc = subprocess.Popen([SYSTEM_PY, "-c", SQUATTER, kind, where, str(record)], user="nobody",
                                stdout=subprocess.PIPE, text=True, cwd="/")
        started.append(proc)
        assert proc.stdout.readline().strip() == "listening"
        return record

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


OPERATOR_KEY = "5e" * 32  # a key of its own: the test does not depend on another's key file
SECRET_JOB = {"name": "mine", "command": ["/bin/true"], "class": "rigid", "nodes": 1,
              "walltime": 30, "env": {"API_TOKEN": "do-not-leak"}}


def test_the_client_refuses_a_socket_another_user_listens_on(shared_dir, squatter):
    path = shared_dir / "scheduler.sock"
    got = squatter("unix", str(path))
    with pytest.raises(SchedulerError, match=r"refusing to talk to .*the socket belongs to "
                                             r"nobody \(uid 65534\), not root, you"):
        request(("127.0.0.1", 1), "submit", socket_path=path, job=SECRET_JOB)
    os.chown(path, 0, 0)  # the file looks right now; the process behind it is still nobody
    with pytest.raises(SchedulerError, match=r"the process listening there runs as nobody"):
        request(("127.0.0.1", 1), "submit", socket_path=path, job=SECRET_JOB)
    assert got.read_bytes() == b""  # the job and its environment went nowhere
    # naming the scheduler's user is how one talks to a scheduler that is not root's
    os.chown(path, NOBODY, NOBODY)
    assert request(("127.0.0.1", 1), "status", socket_path=path, scheduler_uid=NOBODY)["id"] == 99


def test_the_client_refuses_a_local_port_another_user_took(squatter):
    host, port = free_address()  # no scheduler listens there now: anyone may take it
    got = squatter("tcp", str(port))
    with pytest.raises(SchedulerError, match=r"refusing to talk to .*the process listening there "
                                             r"runs as nobody \(uid 65534\)"):
        request((host, port), "submit", key=OPERATOR_KEY, job=SECRET_JOB)  # signed, over TCP
    assert got.read_bytes() == b""


def test_the_default_socket_directory_is_the_daemons_alone(shared_sched):
    s = shared_sched()
    assert s.socket_path.parent == access.ROOT_SOCKET_DIR
    st = s.socket_path.parent.stat()
    assert st.st_uid == 0 and (st.st_mode & 0o777) == 0o711
    plant = subprocess.run([SYSTEM_PY, "-c", "import socket, sys; socket.socket(socket.AF_UNIX)"
                            ".bind(sys.argv[1])", str(access.ROOT_SOCKET_DIR / "1.sock")],
                           user="nobody", capture_output=True, text=True, timeout=30)
    assert plant.returncode != 0 and "Permission denied" in plant.stderr
    assert as_nobody(s.socket_path, {"op": "status"})["ok"]  # and users reach the socket


# -- 9. no oracle on root's files ---------------------------------------------------------------

def test_a_job_that_cannot_start_learns_nothing_of_roots_files(shared_sched, tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "program").write_text("#!/bin/sh\necho hi\n")
    (private / "program").chmod(0o755)
    s = shared_sched()

    def reason(cwd: str, command: str) -> str:
        job_id = submit_as_nobody(s, {"name": "probe", "command": [command], "class": "rigid",
                                      "nodes": 1, "walltime": 30, "cwd": cwd})
        job = ended(s, job_id)
        assert job["state"] == "failed", job
        return job["reason"].replace(command, "COMMAND")

    inside = [reason(str(private), "./program"), reason(str(private), "./nonexistent")]
    assert inside[0] == inside[1] and "Permission denied" in inside[0], inside
    assert "the job's directory" in inside[0] and str(private) in inside[0]
    direct = [reason("/", f"{private}/program"), reason("/", f"{private}/nonexistent")]
    assert direct[0] == direct[1] and "Permission denied" in direct[0], direct
