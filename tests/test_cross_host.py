"""Places on several hosts for real: the virtual cluster's network namespaces
(``tests/vcluster.py``), each with its own address in 198.18.0.0/15, host name,
sshd and slurmd. Runs through ssh and srun, grows onto a new host, GLB under
orders, the scheduler with jobs on other hosts, and hosts that crash or fall
off the network, and places whose process is stopped: each is gone from its host
soon after (its supervisor, ``launcher/_supervise.py``)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually, wait_gone
from orders import free_port

from benchmarks._common import tagged_results

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SURVEY = str(ROOT / "tests" / "launch_prog.py")
PROG = str(ROOT / "tests" / "cross_host_prog.py")

pytestmark = pytest.mark.timeout(180)


def ssh_env(vc, **extra: str) -> dict[str, str]:
    """A program's environment for the ssh launcher over the cluster's sshds."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("APGAS_", "SLURM_"))}
    return {**environ, "PYTHONUNBUFFERED": "1", "APGAS_LAUNCHER": "ssh",
            "APGAS_SSH": shlex.join(vc.ssh_command), **extra}


def run_on(vc, host: str, argv: list[str], env: dict[str, str], timeout: float = 120) -> dict:
    """Run ``argv`` on ``host``; its one RESULT line."""
    proc = vc.exec(host, argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                   start_new_session=True)
    results, out, err = tagged_results(proc, "RESULT ", timeout)
    assert proc.returncode == 0 and len(results) == 1, (proc.returncode, out, err[-5000:])
    return results[0]


def strays(vc) -> dict[str, list[str]]:
    """Processes on the hosts other than their daemons (sshd listener, slurmd)."""
    found = {}
    for host in vc.hosts:
        rest = []
        for pid in vc.pids(host):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if not any(daemon in cmd for daemon in ("sshd -D", "sshd: -D", "slurmd", "slurmstepd")) \
                    and "apgas" in cmd:
                rest.append(cmd)
        if rest:
            found[host] = rest
    return found


@pytest.mark.parametrize("interface", ["*", "address"])
def test_run_on_four_hosts_through_ssh(vcluster, interface):
    vc = vcluster
    setting = "*" if interface == "*" else vc.addresses["vh1"]
    result = run_on(vc, "vh1", [PY, SURVEY],
                    ssh_env(vc, APGAS_HOSTS="vh1,vh2,vh3,vh4", APGAS_INTERFACE=setting))
    start = result["start"]
    assert [(p["place"], p["host"], p["hostname"]) for p in start] == \
        [(i, f"vh{i + 1}", f"vh{i + 1}") for i in range(4)]
    assert [p["ssh"] for p in start] == [False, True, True, True]
    for p in start:  # each place listens where the others reach it on its own host
        where = p["endpoint"].removeprefix("tcp://").rpartition(":")[0]
        assert where == (p["host"] if interface == "*" else vc.addresses[p["host"]]), p
    assert strays(vc) == {}


@pytest.mark.parametrize("interface", ["*", "address"])
def test_run_on_four_hosts_through_srun(vcluster, tmp_path, interface):
    vc = vcluster
    if vc.slurm is None:
        pytest.skip("the virtual cluster runs no Slurm")
    out = tmp_path / "job.out"
    setting = "*" if interface == "*" else vc.addresses["vh1"]  # the batch script runs on vh1
    env = {**vc.env, "PYTHONUNBUFFERED": "1", "APGAS_INTERFACE": setting}
    done = subprocess.run(["sbatch", "--wait", "--nodes=4", "--time=5", f"--output={out}",
                           f"--chdir={ROOT}", f"--wrap={shlex.join([PY, SURVEY])}"],
                          env=env, capture_output=True, text=True, timeout=150)
    text = out.read_text() if out.exists() else ""
    results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and len(results) == 1, (done, text[-5000:])
    start = results[0]["start"]
    assert [(p["host"], p["hostname"], p["node"]) for p in start][1:] == \
        [(f"vh{i}", f"vh{i}", f"vh{i}") for i in (2, 3, 4)]
    assert start[0]["hostname"] == "vh1"  # the batch script runs on the first node
    for p in start:
        where = p["endpoint"].removeprefix("tcp://").rpartition(":")[0]
        assert where == (p["hostname"] if interface == "*" else vc.addresses[p["hostname"]]), p


def test_places_of_one_host_take_the_same_host_path_and_others_tcp(vcluster):
    """Two places on vh1, one on vh2: vh1's pair talk over a Unix stream; the hosts'
    network namespaces keep vh2 apart (an abstract socket is a name in its namespace),
    so its links are ZeroMQ over TCP, as the link-down tests need."""
    vc = vcluster
    result = run_on(vc, "vh1", [PY, SURVEY],
                    ssh_env(vc, APGAS_HOSTS="vh1,vh1,vh2", APGAS_INTERFACE="*"))
    start = result["start"]
    assert [p["hostname"] for p in start] == ["vh1", "vh1", "vh2"]
    assert start[0]["links"] == {"1": "same-host", "2": "zeromq"}
    assert start[1]["links"]["0"] == "same-host" and start[2]["links"]["0"] == "zeromq"
    assert strays(vc) == {}


def test_a_grow_starts_a_place_on_a_host_that_had_none(vcluster):
    vc = vcluster
    listen = f"{vc.addresses['vh1']}:{free_port()}"
    result = run_on(vc, "vh1", [PY, SURVEY],
                    ssh_env(vc, APGAS_HOSTS="vh1,vh2", APGAS_INTERFACE="*",
                            APGAS_MALLEABLE_LISTEN=listen, GROW="vh4", SHRINK="1"))
    assert result["grow_reply"] == ["ok grow 1 places 2"]
    grown = result["grown"][2]
    assert (grown["host"], grown["hostname"]) == ("vh4", "vh4") and grown["ssh"]
    assert result["shrink_reply"] == ["vh4"]
    assert strays(vc) == {}


def test_glb_over_the_hosts_under_grow_and_shrink_orders_is_exact(vcluster):
    vc = vcluster
    listen = f"{vc.addresses['vh1']}:{free_port()}"
    result = run_on(vc, "vh1", [PY, PROG],
                    ssh_env(vc, MODE="glb", APGAS_HOSTS="vh1,vh2", APGAS_INTERFACE="*",
                            APGAS_MALLEABLE_LISTEN=listen, APGAS_THREADS="2",
                            ORDERS="grow 2 vh3 vh4;shrink 1;grow 1 vh4;shrink 2"))
    assert result["total"] == result["expected"]
    assert [r[0].split()[:3] if r and r[0].startswith("ok") else r for r in result["replies"]] == \
        [["ok", "grow", "2"], ["vh4"], ["ok", "grow", "1"], ["vh3", "vh4"]]
    assert result["hosts"] == ["vh1", "vh2"]
    assert strays(vc) == {}


def fail_while_running(vc, fault) -> tuple[dict, float]:
    """Run ``cross_host_prog.py`` in MODE=fail on vh1..vh4, call ``fault()`` once its
    long tasks run (it says so); its result and when the fault came (time.monotonic)."""
    env = ssh_env(vc, APGAS_HOSTS="vh1,vh2,vh3,vh4", APGAS_INTERFACE="*", APGAS_HEARTBEAT="0.5:3",
                  MODE="fail")
    proc = vc.exec("vh1", [PY, PROG], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                   start_new_session=True)
    assert proc.stdout.readline().strip() == "RUNNING"  # the long tasks run at their places
    when = time.monotonic()
    fault()
    results, out, err = tagged_results(proc, "RESULT ", 60)
    assert proc.returncode == 0 and len(results) == 1, (out, err[-5000:])
    return results[0], when


def test_a_crashed_host_fails_what_waits_on_it_and_the_others_go_on(vcluster):
    vc = vcluster
    try:  # kill every process there: the place, the ssh session, sshd, slurmd
        result, crashed = fail_while_running(vc, lambda: vc.kill_host("vh3"))
        assert [c["place"] for c in result["caught"]] == [2], result
        assert result["survivors"] == [0, 1, 3]
        # far below the 120 s the tasks wait for a death that is never noticed
        assert result["detected"] - crashed < 30.0, result
        assert strays(vc) == {}
    finally:
        vc.revive_host("vh3")


def test_a_host_cut_off_the_network_fails_within_the_heartbeat_and_leaves_nothing(vcluster):
    vc = vcluster
    try:
        result, cut = fail_while_running(vc, lambda: vc.link_down("vh4"))
        assert [c["place"] for c in result["caught"]] == [3], result
        assert "no answer to heartbeats for 3 s" in result["caught"][0]["error"]
        assert result["survivors"] == [0, 1, 2]
        # not before the heartbeat's 3 s; the upper bound is far below the 120 s the
        # tasks wait for a death that is never noticed (a loaded machine is slow to see it)
        assert 2.5 <= result["detected"] - cut < 30.0, result
        # on the cut-off host the place saw place 0 fall silent and ended by itself
        eventually(lambda: "vh4" not in strays(vc), "the place on vh4 gone while cut off", 30)
    finally:
        vc.link_up("vh4")
    eventually(lambda: strays(vc) == {}, "nothing left on any host after the link came back", 30)


def test_the_scheduler_runs_and_resizes_jobs_whose_first_node_is_another_host(
        vcluster, tmp_path, monkeypatch):
    from apgas_scheduler.jobs import JobSpec
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.policies import get_policy

    vc = vcluster
    monkeypatch.setenv("APGAS_SSH", shlex.join(vc.ssh_command))
    monkeypatch.delenv("APGAS_LOCAL_HOSTS", raising=False)
    sched = Scheduler(list(vc.hosts), get_policy("malleable", resize_interval=0.5), interval=0.2,
                      host=vc.login_address, port=0, launcher="ssh", output_dir=tmp_path,
                      events=tmp_path / "events.jsonl", state_dir=tmp_path / "state",
                      node_addresses={h: vc.addresses[h] for h in vc.hosts}).start()
    try:
        env = (("APGAS_INTERFACE", "*"), ("END_AT_PLACES", "2"), ("PYTHONUNBUFFERED", "1"))
        m = sched.submit(JobSpec("m", (PY, str(ROOT / "tests" / "reporting_job.py")), "malleable",
                                 1, 3, 90, env, str(ROOT)))

        def jobs():
            return {j["id"]: j for j in sched.status()["jobs"]}

        eventually(lambda: len(jobs()[m]["nodes"]) == 3, "the malleable job grown to 3 nodes", 60)
        r = sched.submit(JobSpec("r", (PY, "-c", "import os, socket; print(socket.gethostname(), "
                                 "os.getcwd())"), "rigid", 2, 2, 60, (), str(ROOT / "tests")))
        eventually(lambda: all(j["state"] in ("done", "failed", "cancelled")
                               for j in jobs().values()), "both jobs ended", 90)
        final = jobs()
    finally:
        sched.shutdown()
    out = (tmp_path / f"job-{m}.out").read_text()
    assert (final[m]["state"], final[r]["state"]) == ("done", "done"), (
        final, out, (tmp_path / f"job-{m}.err").read_text())
    first = final[m]["listen"].rpartition(":")[0]
    assert first == vc.addresses["vh1"] and f"LISTEN {final[m]['listen']}" in out
    lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
             for line in out.splitlines() if line.startswith(("GROWN ", "SHRUNK "))}
    assert [(host, name) for _, host, name in lines["GROWN"]] == \
        [("vh1", "vh1"), ("vh2", "vh2"), ("vh3", "vh3")]
    assert len(lines["SHRUNK"]) == 2 and final[m]["shrinks"] == 1
    host, cwd = (tmp_path / f"job-{r}.out").read_text().split()
    assert host in ("vh3", "vh4") and cwd == str(ROOT / "tests")  # the job's directory, there
    assert strays(vc) == {}


# -- nothing of a stopped or cut-off place stays on its host (issue 30) --------------------

HEARTBEAT, TIMEOUT = "0.5:3", 3.0
# s until a place that cannot end by itself is gone from its host: room for a loaded
# machine, and still far below the never of a stopped place nobody ends
BUDGET = TIMEOUT + 27.0
HOLD = """
import apgas, json, os, time

def main():
    places = apgas.places()
    print("PIDS " + json.dumps({p.id: apgas.at(p, os.getpid) for p in places}), flush=True)
    deadline = time.monotonic() + 60
    while len(apgas.places()) > len(places) - int(os.environ.get("DEATHS", "1")) \
            and time.monotonic() < deadline:
        time.sleep(0.05)  # until place 0 has declared DEATHS places dead
    return {"survivors": [p.id for p in apgas.places()]}

print("RESULT " + json.dumps(apgas.run(main)), flush=True)
"""


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def hold_on_hosts(vc, tmp_path) -> tuple[subprocess.Popen, dict[int, int]]:
    """Start HOLD with place 0 on vh1 and a place on each of vh2..vh4 (ssh); the process
    and every place's pid."""
    prog = tmp_path / "hold.py"
    prog.write_text(HOLD)
    env = ssh_env(vc, APGAS_HOSTS="vh1,vh2,vh3,vh4", APGAS_INTERFACE="*", APGAS_HEARTBEAT=HEARTBEAT)
    proc = vc.exec("vh1", [PY, str(prog)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                   start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("PIDS "):
        proc.kill()
        raise AssertionError((line, proc.communicate(timeout=10)))
    return proc, {int(k): v for k, v in json.loads(line[5:]).items()}


def supervisor_of(place: int) -> int:
    """The pid of the supervisor of the place whose pid is ``place``."""
    parent = _ppid(place)
    assert "launcher._supervise" in _cmdline(parent), _cmdline(parent)
    return parent


def time_until_gone(pids: list[int], fault) -> float:
    """Call ``fault()``; seconds until every one of ``pids`` is gone (at most BUDGET)."""
    began = time.monotonic()
    fault()
    left = wait_gone(pids, BUDGET)
    took = time.monotonic() - began
    print(f"MEASURED {took:.2f} s until {pids} were gone")
    assert left == [], f"still there after {BUDGET} s: {[_cmdline(p) for p in left]}"
    return took


def end(proc: subprocess.Popen, timeout: float = 60) -> dict | None:
    """The RESULT of ``proc`` once it ended (None if it printed none); killed if it hangs."""
    try:
        results, _, err = tagged_results(proc, "RESULT ", timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return results[0] if results else None


def test_a_stopped_place_is_gone_from_its_host_soon_after_it_is_declared_dead(vcluster, tmp_path):
    vc = vcluster
    proc, pids = hold_on_hosts(vc, tmp_path)
    try:  # place 0 declares it dead after TIMEOUT s and kills its ssh client: the supervisor acts
        watched = [pids[1], supervisor_of(pids[1])]
        time_until_gone(watched, lambda: os.kill(pids[1], signal.SIGSTOP))
    finally:
        result = end(proc)
    assert result == {"survivors": [0, 2, 3]}
    assert strays(vc) == {}


def test_a_stopped_place_on_a_cut_off_host_is_gone_from_it_within_the_heartbeat(vcluster, tmp_path):
    vc = vcluster
    proc, pids = hold_on_hosts(vc, tmp_path)
    try:
        watched = [pids[3], supervisor_of(pids[3])]
        os.kill(pids[3], signal.SIGSTOP)
        time_until_gone(watched, lambda: vc.link_down("vh4"))  # nothing reaches vh4 from here on
        assert "vh4" not in strays(vc)  # still cut off: only its supervisor could end it
        result = end(proc)
        assert result == {"survivors": [0, 1, 2]}
    finally:
        vc.link_up("vh4")
        if proc.poll() is None:
            end(proc, 0)
    eventually(lambda: strays(vc) == {}, "nothing left on any host after the link came back", 30)


def test_when_place_0_is_killed_every_place_on_every_host_is_gone(vcluster, tmp_path):
    vc = vcluster
    proc, pids = hold_on_hosts(vc, tmp_path)
    try:  # two places stopped (they cannot see their stdin close), one running
        stopped = [pids[1], pids[2]]
        watched = [*stopped, *map(supervisor_of, stopped), pids[3], supervisor_of(pids[3])]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time_until_gone(watched, lambda: os.kill(pids[0], signal.SIGKILL))
    finally:
        end(proc, 30)
    eventually(lambda: strays(vc) == {}, "nothing left on any host", 30)


def test_under_srun_stopped_places_are_gone_once_dead_or_once_place_0_is(vcluster, tmp_path):
    vc = vcluster
    if vc.slurm is None:
        pytest.skip("the virtual cluster runs no Slurm")
    prog, out = tmp_path / "hold.py", tmp_path / "job.out"
    prog.write_text(HOLD)
    env = {**vc.env, "PYTHONUNBUFFERED": "1", "APGAS_INTERFACE": "*", "APGAS_HEARTBEAT": HEARTBEAT,
           "DEATHS": "2"}
    job = subprocess.Popen(["sbatch", "--wait", "--nodes=4", "--time=5", f"--output={out}",
                            f"--chdir={ROOT}", f"--wrap={shlex.join([PY, str(prog)])}"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)

    def pids_line() -> str | None:
        text = out.read_text() if out.exists() else ""
        found = [line for line in text.splitlines() if line.startswith("PIDS ")]
        return found[0] if found else ("ended" if job.poll() is not None else None)

    try:
        line = eventually(pids_line, "the job's places", 60)
        assert line.startswith("PIDS "), (out.read_text() if out.exists() else "", job.communicate())
        pids = {int(k): v for k, v in json.loads(line[5:]).items()}
        # declared dead: place 0 kills its srun client, and slurmstepd ends the step at once
        time_until_gone([pids[1], supervisor_of(pids[1])], lambda: os.kill(pids[1], signal.SIGSTOP))
        # place 0 killed while a place is stopped: supervisors (and the job's end) end them
        watched = [pids[2], supervisor_of(pids[2]), pids[3], supervisor_of(pids[3])]
        os.kill(pids[2], signal.SIGSTOP)
        time_until_gone(watched, lambda: os.kill(pids[0], signal.SIGKILL))
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
    eventually(lambda: strays(vc) == {}, "nothing left on any host", 30)
