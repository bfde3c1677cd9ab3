"""Places started through a real sshd on 127.0.0.1 (the ``sshd`` fixture)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import time

import pytest
from conftest import wait_gone
from launch_prog import Newest, survey
from orders import order

import apgas
from apgas.errors import ApgasError


@pytest.fixture
def ssh(sshd, monkeypatch):
    """Run this test's programs with the ssh launcher, through the fixture's sshd."""
    monkeypatch.setenv("APGAS_LAUNCHER", "ssh")
    monkeypatch.setenv("APGAS_SSH", shlex.join(sshd.command))
    monkeypatch.delenv("APGAS_LOCAL_HOSTS", raising=False)
    return sshd


def test_first_start_goes_through_ssh(ssh):
    start = apgas.run(survey, hosts="localhost,sshhost2,sshhost3")
    assert [(p["place"], p["host"], p["ssh"]) for p in start] == [
        (0, "localhost", False), (1, "sshhost2", True), (2, "sshhost3", True)]
    assert wait_gone([p["pid"] for p in start[1:]], 5) == []


def test_growth_goes_through_ssh_and_shrink_stops_the_remote_place(ssh, monkeypatch):
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "127.0.0.1:0")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        grow = order(address, "grow 2 sshhost1 sshhost2")
        grown = survey()
        shrink = order(address, "shrink 1")
        return grow, grown, shrink, survey()

    grow, grown, shrink, shrunk = apgas.run(main, places=1)
    assert grow == ["ok grow 2 places 1 2"]
    assert [(p["host"], p["ssh"]) for p in grown[1:]] == [("sshhost1", True), ("sshhost2", True)]
    assert shrink == ["sshhost2"] and [p["place"] for p in shrunk] == [0, 1]
    assert wait_gone([grown[2]["pid"]], 5) == []  # the removed place's process ended


def test_unknown_host_is_reported_with_ssh_words(ssh):
    started = time.monotonic()
    with pytest.raises(ApgasError, match=r"(?s)place 1 on host 'nosuchhost' exited with code 255 "
                                         r"before joining; it said:\n.*Could not resolve hostname"):
        apgas.run(lambda: None, hosts="localhost,nosuchhost", join_timeout=120)
    assert time.monotonic() - started < 60  # not the join timeout: the exit is noticed at once


def test_missing_remote_python_is_reported(ssh):
    with pytest.raises(ApgasError, match=r"(?s)place 1 on host 'sshhost1' exited with code 127 "
                                         r"before joining; it said:\n.*/no/python"):
        apgas.run(lambda: None, hosts="localhost,sshhost1", python="/no/python", join_timeout=10)


def test_failed_grow_over_ssh_leaves_the_table(ssh, monkeypatch):
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "127.0.0.1:0")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        reply = order(address, "grow 2 sshhost1 nosuchhost")
        return reply, [(p.id, p.host) for p in apgas.places()]

    reply, table = apgas.run(main, hosts="localhost,sshhost3")
    assert reply[0].startswith("error no place was added: place 3 on host 'nosuchhost' exited "
                               "with code 255 before joining"), reply
    assert table == [(0, "localhost"), (1, "sshhost3")]


def test_remote_places_exit_when_place_0_dies(ssh, script):
    prog = script("""
        import apgas, json, os, time
        def main():
            print(json.dumps([apgas.at(p, os.getpid) for p in apgas.places()]), flush=True)
            time.sleep(60)
        apgas.run(main, hosts="localhost,sshhost1,sshhost2")
    """)
    assert prog.stdout is not None
    pids = json.loads(prog.stdout.readline())
    os.kill(pids[0], signal.SIGKILL)
    assert wait_gone(pids[1:], 5) == []  # ssh closed their stdin: no orphans on the hosts
