"""Each place's command line, as ``ps`` shows it, names the place (issue 42, item 3):
``apgas place 2 (job 17, host localhost) [apgas._serve --parent P --place 2]``,
and the fork template's says what it is. See launcher._proctitle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import place_processes
from orders import order

import apgas
from launcher import _forkserver
from launcher._proctitle import serve_argv

pytestmark = pytest.mark.timeout(60)


def cmdline(pid: int | None = None) -> str:
    return Path(f"/proc/{pid or 'self'}/cmdline").read_bytes().rstrip(b"\0").decode()


def titles() -> dict[int, str]:
    """At place 0: each place's command line."""
    return {p.id: cmdline(apgas.at(p, os.getpid)) for p in apgas.places()[1:]}


def hosts() -> dict[int, str]:
    return {p.id: p.host for p in apgas.places()}


def expected(place: int, job: str, host: str) -> str:
    return f"apgas place {place} (job {job}, host {host}) " \
           f"[apgas._serve --parent {os.getpid()} --place {place}]"


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_each_place_is_named_in_its_command_line(monkeypatch, method):
    monkeypatch.setenv("APGAS_START_METHOD", method)
    monkeypatch.setenv("APGAS_JOB_ID", "17")

    def main():
        found = titles()
        server = _forkserver._shared
        template = cmdline(server.proc.pid) if method == "fork" and server is not None else None
        return found, hosts(), template, sorted(place_processes(os.getpid()))

    found, host, template, listed = apgas.run(main, places=3, threads=1)
    assert found == {1: expected(1, "17", host[1]), 2: expected(2, "17", host[2])}
    if method == "fork":
        assert template is not None and template.startswith(
            f"apgas fork template (parent {os.getpid()}) [apgas._serve --parent {os.getpid()} "
            "--fork-server "), template
    assert len(listed) == 2 + (method == "fork")  # the tests' search still finds them all


def test_without_a_job_id_the_title_names_the_host(monkeypatch):
    monkeypatch.delenv("APGAS_JOB_ID", raising=False)
    found, host = apgas.run(lambda: (titles(), hosts()), places=2, threads=1)
    assert found == {1: f"apgas place 1 (host {host[1]}) [apgas._serve --parent {os.getpid()} "
                        "--place 1]"}


def test_a_grown_place_is_named_too(malleable_address, monkeypatch):
    monkeypatch.setenv("APGAS_JOB_ID", "5")

    class Newest(apgas.MalleableHandler):
        def pre_shrink(self, n):
            return apgas.places()[-n:]

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        grown = order(address, "grow 1 hostA")
        return grown, titles()

    grown, found = apgas.run(main, places=2, threads=1)
    assert grown == ["ok grow 1 places 2"]
    assert found[1].startswith("apgas place 1 (job 5, host ")
    assert found[2] == f"apgas place 2 (job 5, host hostA) " \
                       f"[apgas._serve --parent {os.getpid()} --place 2]"


def test_the_arguments_are_read_from_a_title_or_a_plain_command_line():
    assert serve_argv(b"apgas place 2 (host n1) [apgas._serve --parent 35 --place 2]\0\0") == \
        ["--parent", "35", "--place", "2"]
    assert serve_argv(b"/usr/bin/python\0-m\0apgas._serve\0--parent\x0035\0--place\x002\0") == \
        ["--parent", "35", "--place", "2"]
    assert serve_argv(b"python\0-m\0glb.apps\0") is None
