"""Host names are never options: one grammar (``apgas.protocol.check_host``) wherever
a host name comes in (grow orders, host files, APGAS_HOSTS, node lists, the
scheduler), and ``--`` before the host on ssh's command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from orders import order

import apgas
from apgas._core.config import load_config
from apgas.errors import ConfigError
from apgas.protocol import check_host, parse_order
from launcher import HostSpecError, SrunLauncher, SshLauncher, expand_hostlist, read_hostfile, slurm_hosts

ROOT = Path(__file__).resolve().parents[2]
PROXY = "-oProxyCommand=touch${IFS}%s"

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("name", ["node1", "node-01.cluster", "n_1", "127.0.0.1", "::1",
                                  "host:2222", "a" * 253])
def test_host_names_that_pass(name):
    assert check_host(name) == name


@pytest.mark.parametrize("name, said", [
    ("-V", "'-V' starts with '-'"),
    ("-oProxyCommand=touch${IFS}/tmp/x", "'-oProxyCommand=touch${IFS}/tmp/x' starts with '-'"),
    ("", "empty host name"),
    ("a b", "'a b' has characters other than"),
    ("a;touch x", "'a;touch x' has characters other than"),
    ("$(id)", "'$(id)' has characters other than"),
    ("nöde", "'nöde' has characters other than"),
    ("a" * 254, "longer than 253 characters"),
])
def test_host_names_that_are_refused_name_the_value(name, said):
    with pytest.raises(ValueError, match="host name|empty") as info:
        check_host(name)
    assert said in str(info.value)
    assert len(str(info.value)) < 300  # a huge value is cut


@pytest.mark.parametrize("line", ["grow 1 -V", "grow 1 -oProxyCommand=touch${IFS}/tmp/x",
                                  "grow 2 ok -V"])
def test_grow_orders_with_an_option_for_a_host_do_not_parse(line):
    with pytest.raises(ValueError, match="^grow: host name '-") as info:
        parse_order(line)
    assert line.split()[-1] in str(info.value)


# -- the job: the order is refused, nothing runs, and it goes on serving ------------------

class Handler(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


def test_grow_orders_naming_options_are_refused_and_nothing_runs(tmp_path, monkeypatch):
    """The grow launcher is ssh, and the "ssh" command leaves a marker if it is ever run."""
    ssh_ran, proxy_ran = tmp_path / "ssh-ran", tmp_path / "proxy-ran"
    monkeypatch.setenv("APGAS_GROW_LAUNCHER", "ssh")
    monkeypatch.setenv("APGAS_SSH", f"sh -c 'touch {ssh_ran}; exit 1' ssh")
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "")
    for var in ("APGAS_SCHEDULER", "APGAS_MALLEABLE_LISTEN", "APGAS_COMMUNICATOR", "APGAS_HOSTS",
                "APGAS_HOSTFILE", "APGAS_LAUNCHER"):
        monkeypatch.delenv(var, raising=False)

    def main():
        address = apgas.define_malleable_handler(Handler()).address
        replies = [order(address, "grow 1 -V"),
                   order(address, "grow 1 " + PROXY % proxy_ran),
                   order(address, "grow 2 localhost -oBatchMode=no")]
        status = order(address, "status")
        grown = order(address, "grow 1 localhost")  # still serving, and a good grow works
        return replies, status, grown, len(apgas.places())

    replies, status, grown, count = apgas.run(main, places=1)
    assert replies[0] == ["error grow: host name '-V' starts with '-' (it would be read as an option)"]
    assert replies[1][0].startswith("error grow: host name '-oProxyCommand=touch${IFS}")
    assert replies[2] == ["error grow: host name '-oBatchMode=no' starts with '-' (it would be "
                          "read as an option)"]
    assert status[0] == "status malleable 1"
    assert grown == ["ok grow 1 places 1"] and count == 2
    assert not ssh_ran.exists() and not proxy_ran.exists()


# -- host files, APGAS_HOSTS, Slurm node lists ----------------------------------------------

def test_a_host_file_line_that_is_an_option_is_refused(tmp_path):
    marker = tmp_path / "x"
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node1\n{PROXY % marker} slots=2\n")
    with pytest.raises(HostSpecError, match=r"line 2: host name '-oProxyCommand=touch\$\{IFS\}"):
        read_hostfile(hostfile)
    with pytest.raises(ConfigError, match="line 2: host name '-oProxyCommand"):
        load_config(environ={"APGAS_HOSTFILE": str(hostfile)})
    assert not marker.exists()


def test_apgas_hosts_with_an_option_is_refused():
    with pytest.raises(ConfigError, match="APGAS_HOSTS: host name '-V' starts with '-'"):
        load_config(environ={"APGAS_HOSTS": "node1,-V"})
    with pytest.raises(ConfigError, match="hosts: host name 'a b'"):
        load_config({"hosts": ["node1", "a b"]}, environ={})


def test_slurm_node_lists_are_checked_and_bounded():
    with pytest.raises(HostSpecError, match="host name '-oProxyCommand=x' starts with '-'"):
        expand_hostlist("node1,-oProxyCommand=x")
    with pytest.raises(HostSpecError, match="names more than 100000 hosts"):
        expand_hostlist("node[0-999999999]")
    with pytest.raises(HostSpecError, match="more than 100000"):
        slurm_hosts("node[1-2]", "999999999,1")
    assert expand_hostlist("n[1-2],login") == ["n1", "n2", "login"]


# -- the launchers ------------------------------------------------------------------------

def test_ssh_puts_the_host_after_a_double_dash_and_refuses_options():
    ssh = SshLauncher()
    argv = ssh.command("sshhost1", ["python", "-c", "pass"])
    assert argv[argv.index("--") + 1] == "sshhost1"
    for host in ("-V", "-oProxyCommand=true"):
        with pytest.raises(OSError, match=f"host name '{host}' starts with '-'"):
            ssh.command(host, ["true"])


def test_ssh_itself_takes_a_double_dash_before_the_host():
    """OpenSSH reads what follows ``--`` as the host, never as an option."""
    try:
        done = subprocess.run(["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", "--",
                               "-V", "true"], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        pytest.skip("no ssh client")
    assert done.returncode == 255 and "OpenSSH" not in done.stderr, done.stderr


def test_srun_refuses_options_as_hosts(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    argv = SrunLauncher().command("node1", ["python"])
    assert "--nodelist=node1" in argv
    with pytest.raises(OSError, match="host name '-w' starts with '-'"):
        SrunLauncher().command("-w", ["python"])


# -- the scheduler ------------------------------------------------------------------------

def test_scheduler_refuses_such_node_names_and_goes_on_serving(tmp_path, monkeypatch):
    from apgas_scheduler.client import SchedulerError, request
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.policies import get_policy

    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    marker = tmp_path / "x"
    with pytest.raises(ValueError, match="node host name '-V' starts with '-'"):
        Scheduler(["node0", "-V"], get_policy("fcfs"), port=0, output_dir=tmp_path / "out0")
    sched = Scheduler(["node0"], get_policy("fcfs"), port=0, interval=0.2,
                      output_dir=tmp_path / "out").start()
    try:
        with pytest.raises(ValueError, match="node host name '-oProxyCommand"):
            sched.add_nodes([PROXY % marker])
        with pytest.raises(SchedulerError, match=r"host name '-oProxyCommand=touch\$\{IFS\}"):
            request(sched.address, "add-nodes", nodes=["node1", PROXY % marker])
        assert [n["name"] for n in request(sched.address, "status")["nodes"]] == ["node0"]
        assert request(sched.address, "add-nodes", nodes=["node1"])["nodes"] == ["node0", "node1"]
    finally:
        sched.shutdown()
        for t in list(sched._threads):
            t.join(10)
    assert not marker.exists()


def test_scheduler_cli_refuses_such_node_names():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["serve", "--nodes=node1,-V"], ["serve", "--nodes=n1", "--node-address=n1=-oX"],
                 ["add-nodes", "--to", "127.0.0.1:9", "--", "-oProxyCommand=true"]):
        done = subprocess.run([sys.executable, "-m", "apgas_scheduler", *args], capture_output=True,
                              text=True, timeout=30, env=env, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert "starts with '-'" in done.stderr, done.stderr
