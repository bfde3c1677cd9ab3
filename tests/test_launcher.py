"""The launcher package: choosing a launcher, host lists, plugins and failures (local launcher)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import time

import pytest
from conftest import install_distribution

import apgas
import launcher
from apgas._core.config import load_config
from apgas.errors import ApgasError, ConfigError
from launcher import HostSpecError, compress_hostlist, expand_hostlist, read_hostfile, slurm_hosts

ALLOCATION = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]",
              "SLURM_TASKS_PER_NODE": "1(x3)"}


# -- detection and configuration -------------------------------------------------------

@pytest.mark.parametrize("environ, expected", [
    ({}, "local"),
    (ALLOCATION, "srun"),
    ({"PMI_RANK": "0", "PMI_SIZE": "4"}, "mpi"),  # MPICH's hydra
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "mpi"),  # Open MPI
    ({**ALLOCATION, "PMI_RANK": "0", "PMI_SIZE": "2"}, "mpi"),  # srun --mpi=pmi2 ranks
    ({"SLURM_JOB_ID": "7"}, "local"),  # no node list: not an allocation we can use
])
def test_detection(environ, expected):
    assert launcher.detect_launcher(environ) == expected
    assert load_config({}, environ).launcher == expected


def test_launcher_variable_wins_over_detection():
    cfg = load_config({}, {**ALLOCATION, "APGAS_LAUNCHER": "ssh"})
    assert (cfg.launcher, cfg.grow_launcher) == ("ssh", "ssh")
    assert load_config({"launcher": "local"}, ALLOCATION).launcher == "local"


def test_allocation_gives_hosts_and_places():
    cfg = load_config({}, ALLOCATION)
    assert cfg.hosts == ("node1", "node2", "node3") and cfg.places == 3
    two_each = {**ALLOCATION, "SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert load_config({}, two_each).hosts == ("node1", "node1", "node2", "node2", "node3")
    assert load_config({"places": 5}, ALLOCATION).places == 5
    assert load_config({}, {**ALLOCATION, "APGAS_HOSTS": "node2"}).hosts == ("node2",)


def test_under_mpiexec_every_rank_is_a_place_and_growth_goes_elsewhere():
    cfg = load_config({}, {"PMI_RANK": "0", "PMI_SIZE": "3"})
    assert (cfg.places, cfg.launcher, cfg.grow_launcher) == (3, "mpi", "local")
    in_slurm = load_config({}, {**ALLOCATION, "PMI_RANK": "0", "PMI_SIZE": "3"})
    assert in_slurm.grow_launcher == "srun"
    assert load_config({"places": 3}, {"PMI_RANK": "0", "PMI_SIZE": "3"}).places == 3


@pytest.mark.parametrize("overrides, environ, message", [
    ({}, {"APGAS_LAUNCHER": "pbs"}, r"APGAS_LAUNCHER must be one of \['local', 'ssh', 'srun', 'mpi'.*'pbs'"),
    ({"grow_launcher": "nope"}, {}, r"grow_launcher must be one of .*'nope'"),
    ({"launcher": "mpi"}, {}, "needs a process started by mpiexec"),
    ({"places": 2}, {"PMI_RANK": "0", "PMI_SIZE": "4"}, "mpiexec started 4 rank"),
    ({}, {"APGAS_GROW_LAUNCHER": "mpi"}, "cannot be 'mpi'"),
    ({"hosts": "a", "hostfile": "/x"}, {}, "not both"),
    ({"hostfile": "/no/such/file"}, {}, "cannot read host file '/no/such/file'"),
    ({}, {**ALLOCATION, "SLURM_JOB_NODELIST": "node[1-x]"}, r"bad range '1-x'"),
])
def test_bad_launch_settings_are_named(overrides, environ, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides, environ)


# -- host lists ------------------------------------------------------------------------

def test_hostfile_slots(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nalpha\nalpha\nbeta slots=2  # two cores\ngamma:3\n\n")
    assert read_hostfile(path) == ("alpha", "alpha", "beta", "beta", "gamma", "gamma", "gamma")
    cfg = load_config({"hostfile": str(path)}, {})
    assert cfg.places == 7 and cfg.hosts[4:] == ("gamma",) * 3
    assert load_config({}, {"APGAS_HOSTFILE": str(path), "APGAS_PLACES": "2"}).places == 2


@pytest.mark.parametrize("text, message", [
    ("alpha\nbeta gamma\n", r"line 2: expected 'host'.*'beta gamma'"),
    ("alpha:0\n", "line 1: slots must be >= 1"),
    ("# nothing\n", "names no host"),
])
def test_bad_hostfile(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(HostSpecError, match=message):
        read_hostfile(path)
    with pytest.raises(ConfigError, match=message):
        load_config({"hostfile": str(path)}, {})


def test_slurm_host_lists():
    assert expand_hostlist("node[1-3]") == ["node1", "node2", "node3"]
    assert expand_hostlist("gpu[08-10],login") == ["gpu08", "gpu09", "gpu10", "login"]
    assert expand_hostlist("r[1-2]n[1,3]") == ["r1n1", "r1n3", "r2n1", "r2n3"]
    assert slurm_hosts("a,b", "2,1") == ("a", "a", "b")
    with pytest.raises(HostSpecError, match="empty"):
        expand_hostlist("")
    for spec, said in [("node[", "unclosed '\\['"), ("a[1-", "unclosed '\\['"),
                       ("n[1-2]]", "unbalanced '\\]'"), ("n[[1]]", "unbalanced '\\['")]:
        with pytest.raises(HostSpecError, match=f"{said} in Slurm host list '{re.escape(spec)}'"):
            expand_hostlist(spec)  # not hosts named 'node' or '1-'


# -- plugins ---------------------------------------------------------------------------

PLUGIN = '''
import json, os
from launcher import LocalLauncher

class Recording(LocalLauncher):
    """Starts places locally and writes down each launch."""
    name = "recording"

    def launch(self, place_id, host, bootstrap, python=""):
        with open(os.environ["LAUNCH_LOG"], "a") as f:
            f.write(json.dumps([place_id, host]) + "\\n")
        return super().launch(place_id, host, bootstrap, python)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A launcher installed the way a package would: a dist-info with an entry point."""
    install_distribution(tmp_path, "recording-launcher", "recording_launcher", PLUGIN,
                         "[apgas.launchers]\nrecording = recording_launcher:Recording\n"
                         "broken = os:getcwd\nmissing = recording_launcher:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("LAUNCH_LOG", str(tmp_path / "launches"))
    return tmp_path


def test_plugin_launcher_is_found_and_used(plugin, script):
    assert "recording" in launcher.launcher_names()
    assert type(launcher.get_launcher("recording")).__name__ == "Recording"
    with pytest.raises(ValueError, match="must name a Launcher subclass"):
        launcher.get_launcher("broken")
    with pytest.raises(ValueError, match=r"entry point 'missing' of apgas.launchers "
                       r"\(recording_launcher:Missing\) cannot be loaded: AttributeError: .*"
                       "declared by recording-launcher"):
        launcher.get_launcher("missing")
    prog = script("""
        import apgas
        print(apgas.run(lambda: [p.id for p in apgas.places()]))
    """, APGAS_LAUNCHER="recording", APGAS_PLACES="3")
    out, err = prog.communicate(timeout=60)
    assert prog.returncode == 0, err
    assert out.strip() == "[0, 1, 2]"
    launches = [json.loads(line) for line in (plugin / "launches").read_text().splitlines()]
    assert [p for p, _ in launches] == [1, 2]


# -- failures --------------------------------------------------------------------------

def test_missing_python_is_reported_with_host_and_reason():
    with pytest.raises(ApgasError, match=r"place 1 could not be started on host '.*' by the "
                                         r"local launcher: .*No such file.*/no/python"):
        apgas.run(lambda: None, places=2, python="/no/python")


def test_place_that_dies_before_joining_is_reported_with_its_own_words(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'fake python: cannot start on this host' >&2\nexit 42\n")
    fake.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(ApgasError, match=r"(?s)exited with code 42 before joining; it said:\n"
                                         r"fake python: cannot start on this host"):
        apgas.run(lambda: None, places=2, python=str(fake), join_timeout=120)
    assert time.monotonic() - started < 60  # not the join timeout: the exit is noticed at once


def test_place_that_never_joins_times_out_with_its_words(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'waiting for a node' >&2\nexec sleep 30\n")
    fake.chmod(0o755)
    with pytest.raises(ApgasError, match=r"(?s)did not join within 1.0 s .*place 1; it said:\n"
                                         r"waiting for a node"):
        apgas.run(lambda: None, places=2, python=str(fake), join_timeout=1.0)


def test_local_launcher_refuses_other_hosts():
    with pytest.raises(ApgasError, match=r"host 'far-away' is not this machine.*APGAS_LAUNCHER"):
        apgas.run(lambda: None, hosts="localhost,far-away")


def test_failed_grow_leaves_the_program_as_it_was(malleable_address, monkeypatch):
    from orders import order

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        before = [(p.id, p.host) for p in apgas.places()]
        rt = apgas._core.runtime.current()
        rt.config = dataclasses.replace(rt.config, python="/no/python")
        reply = order(address, "grow 2 hostA hostB")
        after = [(p.id, p.host) for p in apgas.places()]
        rt.config = dataclasses.replace(rt.config, python="")
        again = order(address, "grow 1 hostC")
        return before, reply, after, again, apgas.at(apgas.places()[-1], lambda: apgas.here().id)

    before, reply, after, again, last = apgas.run(main, places=2)
    assert len(reply) == 1 and reply[0].startswith("error no place was added: place 2 could not "
                                                   "be started on host 'hostA'"), reply
    assert "/no/python" in reply[0]
    assert after == before
    assert again == ["ok grow 1 places 3"] and last == 3  # id 2 was spent on the failed start


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


def test_places_are_not_mpi_ranks(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "5")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "9")
    env = launcher.child_environment()
    assert "PMI_RANK" not in env and "OMPI_COMM_WORLD_SIZE" not in env and "PATH" in env


def test_bound_to_every_interface_places_advertise_their_host_name():
    def endpoints():
        return [apgas.at(p, lambda: apgas._core.runtime.current().transport.endpoint) for p in apgas.places()]

    found = apgas.run(endpoints, places=2, interface="*")
    assert all(e.startswith(f"tcp://{socket.getfqdn()}:") for e in found), found


def test_a_command_on_another_host_enters_the_directory_it_is_given(monkeypatch):
    """The scheduler gives a job's directory; ssh and srun enter it on the job's node
    (not the scheduler's own directory), and default to this directory."""
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "")
    ssh = launcher.get_launcher("ssh")
    remote = ssh.command("far", ["python", "job.py"], {}, cwd="/data/my run")[-1]
    assert remote.startswith("cd '/data/my run' && ") and remote.endswith("exec python job.py")
    assert ssh.command("far", ["true"], {})[-1].startswith(f"cd {os.getcwd()} && ")
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    srun = launcher.get_launcher("srun").command("node1", ["true"], {}, cwd="/data/run")
    assert "--chdir=/data/run" in srun
    assert launcher.get_launcher("local").command("localhost", ["true"], {}, cwd="/x") == ["true"]


@pytest.mark.parametrize("names, spec", [
    (["node0", "node1", "node2", "gpu"], "node[0-2],gpu"),
    (["node8", "node9", "node10", "node3"], "node[8-10],node3"),
    (["a01", "a02"], "a0[1-2]"),
    (["login"], "login"),
])
def test_compress_hostlist_is_expand_hostlists_inverse(names, spec):
    assert compress_hostlist(names) == spec
    assert expand_hostlist(compress_hostlist(names)) == names
