"""The run's CURVE keys: ZMTP-level authentication of the places' TCP connections.

The MAC of every message (:mod:`apgas._core.transport`) keeps forged messages
from being *acted on*, but ZeroMQ reads and buffers whatever a connected peer
sends before the runtime sees it: a stranger's endless multipart message, or a
thousand connections held open after the greeting, cost a place memory and
descriptors. So every TCP socket of a run speaks CURVE (RFC 26) with one key
pair derived from the run's secret, and the connection is refused during the
handshake, before ZeroMQ keeps a frame of it, unless the peer proves it holds
that key:

* the server (a place's ROUTER) holds the secret key, so a client that does
  not know the public key cannot even write a valid HELLO, and a port squatter
  (a process of another user that bound the port of a place that ended) cannot
  answer the client's HELLO: nothing of the run's is sent to it;
* the client's long-term key must be the run's too, which the place's ZAP
  handler (RFC 27) checks: knowing the public key alone is not enough;
* a connection that has not finished its handshake within
  :data:`HANDSHAKE_S` is closed, so idle connections cannot pile up.

The derived key is as strong as the MAC's: both come from the run's 32-byte
secret through keyed BLAKE2b with a purpose of their own, and whoever holds
neither cannot connect, send or read. Inproc sockets (the reply channels'
own ends, the stop socket) do no handshake and need none.
"""

from __future__ import annotations

import hashlib

import zmq
from zmq.utils import z85

__all__ = ["CurveKeys", "keys_of", "HANDSHAKE_S", "ZAP_DOMAIN"]

HANDSHAKE_S = 5.0  # s a TCP connection has to finish its handshake before it is closed
ZAP_DOMAIN = "apgas"


class CurveKeys:
    """The run's CURVE key pair (Z85 text, as libzmq takes it)."""

    __slots__ = ("public", "secret")

    def __init__(self, public: bytes, secret: bytes) -> None:
        self.public, self.secret = public, secret

    def serve(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` (before it binds) accept only clients holding these keys
        (with a ZAP handler in its context: :class:`apgas._core.zmtp_auth.Gatekeeper`)."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        sock.setsockopt(zmq.HANDSHAKE_IVL, round(HANDSHAKE_S * 1000))

    def connect_as_client(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` (before it connects) a client that talks only to a server
        holding these keys, and proves it holds them too."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.HANDSHAKE_IVL, round(HANDSHAKE_S * 1000))


def keys_of(secret: bytes) -> CurveKeys:
    """The CURVE key pair of the run whose secret is ``secret``."""
    if not zmq.has("curve"):
        raise RuntimeError(f"this libzmq ({zmq.zmq_version()}) was built without CURVE, which "
                           "the places' connections need; install pyzmq from its wheel (pip "
                           "install --force-reinstall pyzmq), which bundles a libzmq with it")
    raw = hashlib.blake2b(b"apgas zmtp curve key", key=secret[:64], digest_size=32).digest()
    private = z85.encode(raw)
    return CurveKeys(zmq.curve_public(private), private)
