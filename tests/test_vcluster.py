"""The virtual cluster of network namespaces itself (tests/vcluster.py): names, reachability,
ssh, Slurm, partitions, crashes and that nothing is left behind.  Needs root; skips otherwise."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import vcluster as vc_module
from _slurm import SlurmUnavailable
from _sshd import SshUnavailable
from vcluster import LOGIN, VirtualCluster, VirtualClusterUnavailable, start_vcluster

pytestmark = pytest.mark.timeout(90)

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _connects(address: str, port: int = 22, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _routes(network: str) -> str:
    """The root namespace's routes inside ``network`` (after teardown: none; a connection
    attempt would not tell, as the way out may answer for any address)."""
    return subprocess.run(["ip", "-4", "route", "show", "root", network], capture_output=True,
                          text=True, timeout=10).stdout.strip()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _own_cluster(tmp_path_factory: pytest.TempPathFactory, **options) -> VirtualCluster:
    """A small cluster of this test's own (without Slurm unless asked), in a directory
    whose path is short (unix socket paths under it must stay short)."""
    options.setdefault("slurm", False)
    try:
        return start_vcluster(tmp_path_factory.mktemp("vc"), **options)
    except (VirtualClusterUnavailable, SshUnavailable, SlurmUnavailable) as exc:
        pytest.skip(str(exc))


def _reclaimed(k: int) -> bool:
    """Whether another cluster (of a concurrent test run) now uses block ``k``."""
    return any(n.startswith(f"apgas-vc{k}-") for n in vc_module.leftovers()["namespaces"])


def _gone(vc: VirtualCluster) -> list[str]:
    """What of ``vc`` still exists (empty: all gone)."""
    prefix = f"apgas-vc{vc.index}-{vc.owner}-"
    found = vc_module.leftovers()
    left = [n for n in found["namespaces"] + found["etc"] if n.startswith(prefix)]
    if not _reclaimed(vc.index):
        left += [link for link in found["links"] if link == vc.login_link]
        left += [_routes(vc.network)] if _routes(vc.network) else []
    return left


PROBE = """
import socket, sys
for name in sys.argv[1:]:
    address = socket.gethostbyname(name)
    socket.create_connection((name, 22), timeout=5).close()
    print(name, address)
"""


def test_hosts_reach_each_other_by_name(vcluster):
    for host in vcluster.hosts:
        done = vcluster.run(host, [sys.executable, "-c", PROBE, *vcluster.hosts], timeout=20)
        assert done.returncode == 0, done.stderr
        seen = dict(line.split() for line in done.stdout.splitlines())
        assert seen == {h: vcluster.resolve(h) for h in vcluster.hosts}
        # vlogin (no sshd there) by its name and by this machine's real host name
        for name in (LOGIN, socket.gethostname()):
            found = vcluster.run(host, ["getent", "hosts", name]).stdout.split()
            assert found[:1] == [vcluster.login_address], (name, found)


def test_login_node_reaches_every_host(vcluster):
    for host in vcluster.hosts:
        assert _connects(vcluster.resolve(host)), host
    # by name: on the login node (root network namespace, the cluster's hosts file)
    done = vcluster.run(LOGIN, [sys.executable, "-c", PROBE, *vcluster.hosts], timeout=20)
    assert done.returncode == 0, done.stderr
    assert vcluster.run(LOGIN, ["hostname"]).stdout.strip() == LOGIN


def test_each_host_has_its_name_and_only_its_address(vcluster):
    for i, host in enumerate(vcluster.hosts, 1):
        assert vcluster.resolve(host) == f"{vcluster.network.rsplit('.', 1)[0]}.{i}"
        assert vcluster.run(host, ["hostname"]).stdout.strip() == host
        v4 = re.findall(r"inet (\S+)", vcluster.run(host, ["ip", "-4", "-o", "addr"]).stdout)
        assert sorted(v4) == sorted(["127.0.0.1/8", f"{vcluster.resolve(host)}/24"])
        v6 = re.findall(r"inet6 (\S+)", vcluster.run(host, ["ip", "-6", "-o", "addr"]).stdout)
        assert v6 in ([], ["::1/128"])  # no link-local address either
        assert vcluster.resolve(host).startswith(("198.18.", "198.19."))


def test_ssh_to_every_host_from_login_and_from_a_host(vcluster):
    if not vcluster.ssh_command:
        pytest.skip("no sshd")
    for host in vcluster.hosts:
        done = subprocess.run(vcluster.ssh(host, "hostname; ip -4 -o addr show eth0"),
                              capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[0] == host
        assert f"inet {vcluster.resolve(host)}/24" in done.stdout
    # from inside a namespace, with the same client config
    first, last = vcluster.hosts[0], vcluster.hosts[-1]
    done = vcluster.run(first, vcluster.ssh(last, "hostname"), timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == last


def test_srun_runs_one_task_per_namespace(vcluster):
    if vcluster.slurm is None:
        pytest.skip("no Slurm")
    n = len(vcluster.hosts)
    done = vcluster.slurm.run(
        "srun", f"-N{n}", "--ntasks-per-node=1", "sh", "-c",
        "echo $SLURMD_NODENAME $(hostname) $(ip -4 -o addr show eth0 | awk '{print $4}')",
        timeout=30)
    assert done.returncode == 0, done.stderr + vcluster.slurm.logs()
    rows = sorted(tuple(line.split()) for line in done.stdout.splitlines())
    assert rows == sorted((h, h, f"{vcluster.resolve(h)}/24") for h in vcluster.hosts)
    # srun from inside a host works too (slurmctld is at the login address)
    done = vcluster.run(vcluster.hosts[1], ["srun", "-N1", "-w", vcluster.hosts[2], "hostname"],
                        env=vcluster.env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == vcluster.hosts[2]


REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 22), timeout=1).close()
except OSError:
    sys.exit(1)
"""


def test_link_down_cuts_a_host_off_and_link_up_brings_it_back(vcluster):
    cut, other = vcluster.hosts[-1], vcluster.hosts[0]
    reach = [sys.executable, "-c", REACH]
    assert _connects(vcluster.resolve(cut))
    vcluster.link_down(cut)
    try:
        assert not vcluster.link_is_up(cut)
        assert not _connects(vcluster.resolve(cut))
        assert vcluster.run(other, [*reach, cut]).returncode == 1
        assert vcluster.run(cut, [*reach, other]).returncode == 1
        assert vcluster.run(other, [*reach, vcluster.hosts[1]]).returncode == 0
        assert cut in vcluster.run(cut, ["hostname"]).stdout  # still running, only cut off
    finally:
        vcluster.link_up(cut)
    deadline = time.monotonic() + 30
    while not _connects(vcluster.resolve(cut)):
        assert time.monotonic() < deadline, "host not reachable again after link_up"
        time.sleep(0.1)
    assert vcluster.run(other, [*reach, cut]).returncode == 0
    if vcluster.slurm is not None:  # leave Slurm as it was for the next tests
        deadline = time.monotonic() + 30
        while set(vcluster.slurm.node_states().values()) != {"idle"}:
            assert time.monotonic() < deadline, vcluster.slurm.node_states()
            time.sleep(0.2)


def test_kill_host_revive_host_and_stop_leave_nothing(tmp_path_factory):
    vc = _own_cluster(tmp_path_factory, hosts=2, slurm=True, accounting=False)
    try:
        sleeper = vc.exec("vh1", ["sleep", "300"])
        remote = subprocess.Popen(vc.ssh("vh2", "sleep 300"), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while "sleep" not in map(_comm, vc.pids("vh2")):
            assert time.monotonic() < deadline, vc.pids("vh2")
            time.sleep(0.05)
        killed = vc.kill_host("vh1")
        assert sleeper.pid in killed and vc.ssh_servers["vh1"].process.pid in killed
        assert vc.slurm._procs["slurmd-vh1"].pid in killed
        assert sleeper.wait(30) == -signal.SIGKILL
        assert vc.pids("vh1") == []
        assert not _connects(vc.resolve("vh1"))  # its sshd is gone
        vc.revive_host("vh1")
        done = subprocess.run(vc.ssh("vh1", "hostname"), capture_output=True, text=True,
                              timeout=20, stdin=subprocess.DEVNULL)
        assert done.stdout.strip() == "vh1", done.stderr
        done = vc.slurm.run("srun", "-N2", "hostname", timeout=30)
        assert sorted(done.stdout.split()) == ["vh1", "vh2"], done.stderr
        left_running = vc.pids("vh1") + vc.pids("vh2")
    finally:
        vc.stop()
    remote.wait(10)
    assert not [p for p in left_running if vc_module._alive(p)]
    assert _gone(vc) == []


def test_a_killed_owner_is_cleaned_up_by_the_next_start(tmp_path, vcluster):
    code = ("import sys, time, vcluster\n"
            "vc = vcluster.start_vcluster(sys.argv[1], hosts=2, slurm=False)\n"
            "print(vc.index, vc.owner, *vc.pids('vh1'), flush=True)\n"
            "time.sleep(300)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "crash")], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    if not line:
        pytest.skip("the child could not start a cluster")
    k, owner, *pids = map(int, line.split())
    run = f"apgas-vc{k}-{owner}"
    assert any(n.startswith(run) for n in vc_module.leftovers()["namespaces"])
    done = subprocess.run([sys.executable, str(TESTS / "vcluster.py"), "down"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert run in done.stdout
    found = vc_module.leftovers()
    assert not [n for n in found["namespaces"] + found["etc"] if n.startswith(run + "-")]
    if not _reclaimed(k):
        assert f"apgas-vc{k}" not in found["links"]
    assert not [p for p in pids if vc_module._alive(p)]
    # a live owner's cluster (this session's) is left alone
    assert vcluster.namespaces[vcluster.hosts[0]] in found["namespaces"]
    assert _connects(vcluster.resolve(vcluster.hosts[0]))


def test_command_line_up_and_ctrl_c(tmp_path):
    try:  # what `up --no-slurm` needs: root, ip/nsenter/unshare and sshd (issue 29: it failed without)
        vc_module.check_available(ssh=True, slurm=False)
    except (VirtualClusterUnavailable, SshUnavailable) as exc:
        pytest.skip(str(exc))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(TESTS / "vcluster.py"), "up", "--hosts", "2",
                             "--no-slurm", "--workdir", str(tmp_path / "cli")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        while not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read()
                if proc.wait(30) == 2 and err.startswith("vcluster: "):
                    # what the fixture's clusters skip on too, e.g. root without the
                    # permission to make network namespaces (in a container)
                    pytest.skip(err.strip().splitlines()[0])
                raise AssertionError(f"vcluster.py up ended ({proc.returncode}): {err}")
            lines.append(line)
        text = "".join(lines)
        address = re.search(r"vh2\s+(198\.1[89]\.\d+\.2)", text).group(1)
        k = int(re.search(r"namespaces apgas-vc(\d+)-", text).group(1))
        assert _connects(address)
        assert "ssh_config" in text
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "removed in" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = vc_module.leftovers()
    assert not [n for n in found["namespaces"] + found["etc"] if n.startswith(f"apgas-vc{k}-{proc.pid}-")]
    if not _reclaimed(k):
        assert _routes(address.rsplit(".", 1)[0] + ".0/24") == ""
        assert f"apgas-vc{k}" not in found["links"]


@pytest.mark.slow
def test_sshd_ends_a_session_whose_client_vanished(tmp_path_factory):
    vc = _own_cluster(tmp_path_factory, hosts=2)
    try:
        client = vc.exec("vh1", vc.ssh("vh2", "sleep 300"), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while "sleep" not in map(_comm, vc.pids("vh2")):  # logged in, command running
            assert time.monotonic() < deadline, vc.pids("vh2")
            time.sleep(0.05)
        session = [p for p in vc.pids("vh2")
                   if p != vc.ssh_servers["vh2"].process.pid and _comm(p) == "sshd"]
        vc.link_down("vh1")  # the client vanishes without closing the connection
        began = time.monotonic()
        while any(vc_module._alive(p) for p in session):
            # ClientAlive* give up after about 4 s; 30 leaves room for load and is still
            # far below the 300 s the session would otherwise last
            assert time.monotonic() - began < 30, "sshd kept the session of a vanished client"
            time.sleep(0.1)
        assert client.poll() is None  # the client itself hangs on: only the server gave up
    finally:
        vc.stop()
        client.wait(10)
