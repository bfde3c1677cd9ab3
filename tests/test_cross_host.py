"""Places on several hosts for real: the virtual cluster's network namespaces
(``tests/vcluster.py``), each with its own address in 198.18.0.0/15, host name,
sshd and slurmd. Runs through ssh and srun, grows onto a new host, GLB under
orders, the scheduler with jobs on other hosts, and hosts that crash or fall
off the network."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually
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
    long tasks run; its result and when the fault came (time.monotonic)."""
    env = ssh_env(vc, APGAS_HOSTS="vh1,vh2,vh3,vh4", APGAS_INTERFACE="*", APGAS_HEARTBEAT="0.5:3",
                  MODE="fail")
    proc = vc.exec("vh1", [PY, PROG], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                   start_new_session=True)
    assert proc.stdout.readline().strip() == "RUNNING"
    time.sleep(0.5)  # the long tasks have reached their places
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
        assert result["detected"] - crashed < 5.0, result
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
        assert 2.5 <= result["detected"] - cut < 6.0, result
        # on the cut-off host the place saw place 0 fall silent and ended by itself
        eventually(lambda: "vh4" not in strays(vc), "the place on vh4 gone while cut off", 10)
    finally:
        vc.link_up("vh4")
    eventually(lambda: strays(vc) == {}, "nothing left on any host after the link came back", 20)


def test_the_scheduler_runs_and_resizes_jobs_whose_first_node_is_another_host(
        vcluster, tmp_path, monkeypatch):
    from apgas_scheduler.daemon import Scheduler
    from apgas_scheduler.jobs import JobSpec
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
