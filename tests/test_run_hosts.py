"""``apgas.run(main, places=N)`` inside a job whose scheduler handed out hosts:
a number of places that differs from the host slots starts anyway, with one
warning that names the number, the hosts, which of them get more places than
slots or none, and what to do (``docs/cluster.md``)."""

from __future__ import annotations

import logging

import pytest

import apgas
from apgas._core.config import host_mismatch, load_config

pytestmark = pytest.mark.timeout(60)

HANDED = "node0,node1,node2"


@pytest.fixture
def warnings():
    """The warnings of ``apgas.run``'s logger (the runtime's own handler does not
    propagate to pytest's)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("apgas.run")
    logger.addHandler(handler)
    yield lambda: [r.getMessage() for r in records]
    logger.removeHandler(handler)


def hosts_of_places():
    return [(p.id, p.host) for p in apgas.places()]


@pytest.fixture
def handed(monkeypatch):
    """The job got three hosts, as the scheduler sets them (all run here)."""
    monkeypatch.setenv("APGAS_HOSTS", HANDED)
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    monkeypatch.delenv("APGAS_PLACES", raising=False)


def test_more_places_than_hosts_start_with_a_warning(handed, warnings):
    assert apgas.run(hosts_of_places, places=4, threads=1) == [
        (0, "node0"), (1, "node1"), (2, "node2"), (3, "node0")]
    [text] = warnings()
    assert text.startswith("starting 4 places (places=4) on the 3 host slot(s) handed to this "
                           "job (APGAS_HOSTS: node0, node1, node2); places are cycled over them, "
                           "so node0 runs places 0, 3 on 1 slot(s)."), text
    assert "Leave the number of places unset for one place per slot, ask the scheduler for 4 " \
           "hosts, or give apgas.run the hosts (hosts=...)" in text


def test_fewer_places_than_hosts_name_the_idle_ones(handed, warnings):
    assert apgas.run(hosts_of_places, places=2, threads=1) == [(0, "node0"), (1, "node1")]
    [text] = warnings()
    assert "starting 2 places (places=2)" in text
    assert "these get no place and stay idle: node2." in text


def test_the_count_from_apgas_places_is_named(handed, warnings, monkeypatch):
    monkeypatch.setenv("APGAS_PLACES", "2")
    assert len(apgas.run(hosts_of_places, threads=1)) == 2
    [text] = warnings()
    assert text.startswith("starting 2 places (APGAS_PLACES=2)"), text


def test_no_warning_when_the_counts_agree_or_the_caller_chose_the_hosts(handed, warnings):
    assert apgas.run(hosts_of_places, threads=1) == [(0, "node0"), (1, "node1"), (2, "node2")]
    assert apgas.run(hosts_of_places, places=3, threads=1)[-1] == (2, "node2")
    assert apgas.run(hosts_of_places, places=2, hosts="node0,node0", threads=1) == [
        (0, "node0"), (1, "node0")]
    assert warnings() == []


def test_host_files_and_slurm_allocations_are_handed_out_too(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nodeA slots=2\nnodeB\n")
    env = {"APGAS_HOSTFILE": str(hostfile)}
    text = host_mismatch(load_config({"places": 5}, env), {"places": 5}, env)
    assert f"on the 3 host slot(s) handed to this job (APGAS_HOSTFILE {hostfile}: nodeA (2 " \
           "slots), nodeB); places are cycled over them, so nodeA runs places 0, 1, 3, 4 on 2 " \
           "slot(s). " in text
    text = host_mismatch(load_config({"places": 2}, env), {"places": 2}, env)
    assert "these get no place and stay idle: nodeB." in text
    env = {"APGAS_HOSTFILE": str(hostfile), "APGAS_PLACES": "2"}
    assert "nodeB" in host_mismatch(load_config({}, env), {}, env)

    slurm = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "1(x3)"}
    text = host_mismatch(load_config({"places": 4}, slurm), {"places": 4}, slurm)
    assert "(the Slurm allocation, SLURM_JOB_NODELIST: n1, n2, n3)" in text
    assert host_mismatch(load_config({}, slurm), {}, slurm) is None


def test_no_warning_under_mpiexec_or_without_hosts():
    mpi = {"PMI_RANK": "0", "PMI_SIZE": "4", "APGAS_HOSTS": "a,b"}
    assert host_mismatch(load_config({}, mpi), {}, mpi) is None  # the ranks are the places
    assert host_mismatch(load_config({"places": 4}, {}), {"places": 4}, {}) is None


def test_a_long_list_of_hosts_is_cut_short():
    env = {"APGAS_HOSTS": ",".join(f"n{i}" for i in range(40))}
    text = host_mismatch(load_config({"places": 2}, env), {"places": 2}, env)
    assert "n0, n1, n2, n3, n4, n5, n6, n7 and 32 more" in text
    assert "stay idle: n2, n3, n4, n5, n6, n7, n8, n9 and 30 more." in text
