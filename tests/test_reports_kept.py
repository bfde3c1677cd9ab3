"""A report the scheduler cannot take when it is made (the scheduler restarts) is
kept and sent once it is back: a lost ``APGAS-Ready`` would have the job killed
as one that never registered."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from orders import free_port

import apgas
from apgas import protocol

pytestmark = pytest.mark.timeout(60)


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


class Seen(logging.Handler):
    """Sets ``failed`` at the communicator's first warning that names ``scheduler``:
    a report could not be sent there."""

    def __init__(self, scheduler: str) -> None:
        super().__init__(logging.WARNING)
        self.scheduler, self.failed = scheduler, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.scheduler in record.getMessage():
            self.failed.set()


def test_the_ready_line_reaches_a_scheduler_that_comes_back(monkeypatch, malleable_address):
    port = free_port()  # nobody listens there yet: the scheduler is away
    monkeypatch.setenv("APGAS_SCHEDULER", f"127.0.0.1:{port}")
    seen = Seen(f"127.0.0.1:{port}")
    logging.getLogger("apgas").addHandler(seen)

    def main():
        apgas.define_malleable_handler(Newest())
        assert seen.failed.wait(20), "no report failed"
        with socket.create_server(("127.0.0.1", port)) as back:  # the scheduler is back
            back.settimeout(10)  # the ready line is lost if it does not come
            conn, _ = back.accept()
            with conn:
                line = conn.makefile().readline()
            apgas.disable_malleable_handler()
        return line

    try:
        line = apgas.run(main, places=1)
    finally:
        logging.getLogger("apgas").removeHandler(seen)
    assert line.split()[-1] == f"{protocol.READY}:127.0.0.1"  # signed with the job's key
