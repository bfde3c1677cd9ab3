"""The ZAP handler of a place's ZeroMQ context: only the run's key gets in.

The keys and what they protect against are in :mod:`launcher._curve` (the
launcher's supervisor links with them too, and the launcher imports nothing
of apgas).
"""

from __future__ import annotations

import logging
import threading

import zmq
from zmq.auth.thread import ThreadAuthenticator

from launcher._curve import ZAP_DOMAIN, CurveKeys

__all__ = ["Gatekeeper"]

log = logging.getLogger("apgas.transport")


class _RunKeyOnly:
    """ZAP credentials: the run's public key, nothing else."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key == self.public


class Gatekeeper:
    """The ZAP handler of one ZeroMQ context: started before its servers bind,
    stopped before the context ends."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], keys: CurveKeys, name: str) -> None:
        self._auth = ThreadAuthenticator(ctx, log=log.getChild("zap"))
        self._keys, self._name = keys, name
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._auth.start()
            self._auth.thread.name = self._name
            self._auth.configure_curve_callback(ZAP_DOMAIN, _RunKeyOnly(self._keys.public))

    def stop(self) -> None:
        with self._lock:
            if self._auth.is_alive():
                self._auth.stop()
