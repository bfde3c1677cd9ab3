"""benchmarks.dist's floor: pyzmq alone moving numpy buffers between two processes,
plain and signed as the places' transport signs (part 1's yardsticks)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import zmq

from apgas.lowlevel import payload_digest
from benchmarks._floor import SpawnedPeer, connected

__all__ = ["BareFloor", "BARE_CHUNK"]

MiB = 1 << 20
BARE_CHUNK = 16 * MiB                # frames of the bare floor
_MAC_KEY = b"benchmarks.dist: a key for the signed floor"


def _sign(frame: Any) -> bytes:
    """A frame's MAC as the places' transport takes it: its digest (``apgas.lowlevel.payload_digest``, BLAKE3)
    under keyed BLAKE2b."""
    nbytes = memoryview(frame).nbytes
    digest = payload_digest([frame], [nbytes]) or bytes(frame)
    return hashlib.blake2b(digest, key=_MAC_KEY, digest_size=32).digest()
# -- the bare floor --------------------------------------------------------------------------------

def _bare_peer(endpoint: str) -> None:
    """The receiving process: for each ``total`` announced, keep every frame until
    ``total`` bytes have come, then answer; ends on a negative announcement. With
    ``mac``, each frame comes after its keyed BLAKE2b digest, which is checked."""
    with connected(zmq.PAIR, endpoint) as sock:
        while True:
            words = sock.recv().split()
            total, mac = int(words[0]), words[1:] == [b"mac"]
            if total < 0:
                return
            kept: list[zmq.Frame] = []
            got = 0
            ok = True
            while got < total:
                if mac:
                    digest, frame = sock.recv_multipart(copy=False)
                    ok &= _sign(frame.buffer) == digest.bytes
                else:
                    frame = sock.recv(copy=False)
                kept.append(frame)
                got += len(frame)
            sock.send(b"ok" if ok else b"bad")
            del kept


class BareFloor(SpawnedPeer):
    """pyzmq alone: this process sends numpy buffers zero-copy to a second one."""

    def __init__(self) -> None:
        super().__init__(zmq.PAIR, _bare_peer)
        self._buffer = np.ones(0, np.uint8)
        self.transfer(1)  # connected and answering

    def reserve(self, nbytes: int) -> None:
        """Make (and touch) the send buffer for transfers of up to ``nbytes``."""
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(0, np.uint8)
            self._buffer = np.ones(nbytes, np.uint8)

    def release(self) -> None:
        self._buffer = np.empty(0, np.uint8)

    def transfer(self, nbytes: int, mac: bool = False) -> float:
        """Seconds to move ``nbytes`` into the other process's memory; with ``mac``, each
        frame signed here and checked there, as the places' transport does (:func:`_sign`)."""
        self.reserve(nbytes)
        sock, data = self._sock, self._buffer.data
        start = time.perf_counter()
        sock.send(f"{nbytes} {'mac' if mac else 'bare'}".encode())
        for lo in range(0, nbytes, BARE_CHUNK):
            frame = data[lo:min(nbytes, lo + BARE_CHUNK)]
            if mac:
                sock.send(_sign(frame), zmq.SNDMORE)
            sock.send(frame, copy=False)
        if sock.recv() != b"ok":
            raise RuntimeError("the bare floor's peer found a frame altered")
        return time.perf_counter() - start

    def close(self) -> None:
        self.release()
        self.stop(b"-1", 10)

