"""Issue 40, item 7: with the ssh launcher, a job's environment (its ``env``, its tag,
its key) travels on ssh's stdin, never in a command line that every local user can
read (``/proc/<pid>/cmdline``), and arrives exact: newlines, quotes and any byte
but NUL.

The first tests run the remote side's command under ``/bin/sh -c`` here, with the
stdin the launcher made (no sshd needed); the last runs a scheduler's job through
a real sshd on 127.0.0.1 (skipped, saying why, without one)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import eventually

from launcher.ssh import SshLauncher

pytestmark = pytest.mark.timeout(90)
SECRET = "s3cr3t\nline2 'q'"
TAG = "1-0123456789abcdef0123456789abcdef"
ENV = {"DB_PASSWORD": SECRET, "APGAS_SCHEDULER_JOB": TAG, "EMPTY": "", "NEWLINE": "\n",
       "ENDS": ".\n.\n", "SHELL_WORDS": "$(id) `id` $HOME \\ \" ' \\n ; exit 3",
       "CONTROL": "x\r\ny\t\x1b[2J\n\n", "LEADING": "-n -e", "EXPORT": "export X=1\n.",
       "BYTES": "caf\u00e9 \udcff"}  # \udcff: the byte 0xff, as os.environ holds it
SHOW = ("import json, os, sys\n"
        "names = json.loads(sys.argv[1])\n"
        "print(json.dumps({'env': {n: os.environ.get(n) for n in names}, "
        "'stdin': sys.stdin.read(), 'cwd': os.getcwd()}))\n")
SHELLS = [sh for sh in ("/bin/sh", "/bin/dash", "/bin/bash") if os.path.exists(sh)]


@pytest.fixture
def far(monkeypatch):
    """The ssh launcher, taking the host "far" for another machine."""
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "")
    return SshLauncher()


def remote(launcher: SshLauncher, env: dict[str, str], cwd: str) -> tuple[list[str], bytes]:
    """The ssh command and its stdin, as the scheduler has them made (every variable
    named as one that comes on stdin)."""
    argv = launcher.command("far", [sys.executable, "-c", SHOW, json.dumps(list(env))], env,
                            secret_names=list(env), cwd=cwd)
    command = "\0".join(argv)
    for name, value in env.items():
        assert len(value) < 4 or value not in command, f"{name}'s value is in ssh's command line"
    assert "s3cr3t" not in command and TAG not in command, command
    stdin = launcher.secret_input("far", env)
    assert stdin is not None
    return argv, stdin


@pytest.mark.parametrize("shell", SHELLS)
def test_the_environment_is_in_no_command_line_and_arrives_exact(far, tmp_path, shell):
    argv, stdin = remote(far, ENV, str(tmp_path))
    assert argv[-3:-1] == ["--", "far"] and argv[-1].startswith(f"cd {tmp_path} && ")
    # what sshd does with it: the user's shell runs the command, its stdin the block and then
    # whatever the program itself is sent
    out = subprocess.run([shell, "-c", argv[-1]], input=stdin + b"the program's own\n",
                         capture_output=True, timeout=30, env={"PATH": os.defpath})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["env"] == ENV
    assert seen["stdin"] == "the program's own\n" and seen["cwd"] == str(tmp_path)


def test_without_its_whole_block_or_its_directory_nothing_runs(far, tmp_path):
    argv, stdin = remote(far, ENV, str(tmp_path))
    for cut in (b"", stdin[: len(stdin) // 2], stdin[:-2]):
        out = subprocess.run(["/bin/sh", "-c", argv[-1]], input=cut, capture_output=True,
                             timeout=30)
        assert out.returncode == 125 and out.stdout == b"", (cut, out)
        assert b"apgas: the environment did not come on stdin" in out.stderr
    argv, stdin = remote(far, ENV, str(tmp_path / "gone"))
    out = subprocess.run(["/bin/sh", "-c", argv[-1]], input=stdin, capture_output=True, timeout=30)
    assert out.returncode not in (0, 125) and out.stdout == b"" and b"gone" in out.stderr


def test_what_cannot_be_an_environment_is_refused(far):
    for env, said in (({"A=B": "1"}, "not a variable name"), ({"A": "x\0y"}, "NUL character"),
                      ({"A": "\ud800"}, "cannot pass the environment")):
        with pytest.raises(OSError, match=said):
            far.secret_input("far", env)
    assert far.secret_input("localhost", ENV) is None  # here the environment carries it
    # variables not named as coming on stdin stay in the command, as before
    assert far.command("far", ["true"], {"X": "1"})[-1].endswith("exec env X=1 true")


# -- a scheduler's job through a real sshd -------------------------------------------------

SCRIPT = ('printf %s "$DB_PASSWORD" > seen.tmp && mv seen.tmp seen; '
          'printf %s "$APGAS_SCHEDULER_JOB" > tag; i=0; '
          'while [ ! -e go ] && [ "$i" -lt 600 ]; do sleep 0.05; i=$((i + 1)); done')


def cmdlines() -> dict[int, bytes]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                pass
    return found


def test_a_jobs_env_and_tag_are_in_no_command_line_while_it_runs(sshd, tmp_path, monkeypatch):
    from apgas_scheduler.jobs import parse_job
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.policies import get_policy

    monkeypatch.setenv("APGAS_SSH", shlex.join(sshd.command))
    monkeypatch.delenv("APGAS_LOCAL_HOSTS", raising=False)  # sshhost1 is another host
    work = tmp_path / "work"
    work.mkdir()
    sched = Scheduler(["sshhost1"], get_policy("fcfs"), port=0, launcher="ssh", interval=0.2,
                      output_dir=tmp_path / "out", state_dir=tmp_path / "state",
                      events=tmp_path / "events.jsonl").start()
    try:
        job_id = sched.submit(parse_job({
            "name": "secretive", "command": ["/bin/sh", "-c", SCRIPT], "class": "rigid",
            "nodes": 1, "walltime": 60, "cwd": str(work), "env": {"DB_PASSWORD": SECRET}}))
        tag = eventually(lambda: (work / "tag").exists() and (work / "tag").read_text(),
                         "the job running on sshhost1", 30)
        assert tag == sched._jobs[job_id].identity["tag"]
        lines = cmdlines()
        ssh = [pid for pid, line in lines.items()
               if b"BatchMode=yes" in line and b"\0sshhost1\0" in line]
        assert ssh, "no ssh client runs the job: the attack was not tried"
        for needle in (b"s3cr3t", b"line2", tag.encode()):
            holders = {pid: line.replace(b"\0", b" ")[:300] for pid, line in lines.items()
                       if needle in line}
            assert not holders, f"{needle!r} is in the command line of {holders}"
        (work / "go").touch()
        eventually(lambda: sched.status()["jobs"][0]["state"] not in ("queued", "running"),
                   "the job ended", 30)
        job = sched.status()["jobs"][0]
        assert job["state"] == "done", (job, (tmp_path / "out" / f"job-{job_id}.err").read_text())
    finally:
        (work / "go").touch()
        sched.shutdown()
        for t in list(sched._threads):
            t.join(10)
    assert (work / "seen").read_bytes() == SECRET.encode()  # exact: the newline, the quotes

