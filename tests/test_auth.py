"""No unauthenticated message is ever unpickled."""

from __future__ import annotations

import os
import pickle
import time

import pytest
import zmq

import apgas
from apgas._core.runtime import TASK, current
from apgas._core.transport import HEADER


class Exploit:
    """Unpickling this creates a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def endpoint_and_rejected() -> tuple[str, int]:
    rt = current()
    return rt.transport.endpoint, rt.transport.rejected


@pytest.mark.timeout(30)
def test_forged_messages_are_dropped_and_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Exploit(str(marker)), protocol=5)
    assert not marker.exists()

    def main():
        endpoint, before = apgas.at(apgas.place(1), endpoint_and_rejected)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        current().transport.secure(sock)  # past the handshake (CURVE): the MAC still refuses
        sock.connect(endpoint)
        header = HEADER.pack(TASK, 0, 0, 1)
        forged = [
            [b"\0" * 32, header, payload],  # wrong MAC
            [os.urandom(32), header, payload, payload],
            [payload],  # one frame
            [b"short", header, payload],  # malformed MAC
            [b"\0" * 32, b"bad header", payload],
        ]
        for frames in forged:
            sock.send_multipart(frames)
        deadline = time.monotonic() + 10
        while apgas.at(apgas.place(1), endpoint_and_rejected)[1] < before + len(forged):
            assert time.monotonic() < deadline, "forged messages were not all rejected"
            time.sleep(0.02)
        sock.close()
        ctx.term()
        # the place still works
        return apgas.at(apgas.place(1), lambda: apgas.here().id)

    assert apgas.run(main, places=2) == 1
    assert not marker.exists()
