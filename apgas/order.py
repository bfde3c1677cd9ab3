"""Send one order to a malleable job and print the reply.

    python -m apgas.order --to HOST:PORT grow 2 nodeA nodeB
    python -m apgas.order --to HOST:PORT shrink 1
    python -m apgas.order --to HOST:PORT status

Exit status: 0 for a reply without error, 1 for an ``error`` reply, 2 when the
job cannot be reached.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable

from . import auth
from ._core.config import parse_address

__all__ = ["send_order", "main"]
from .errors import ConfigError


def send_order(address: tuple[str, int], order: str | list[str] | bytes, timeout: float = 120.0, *,
               secret: str | None = None, on_first_line: Callable[[], None] | None = None
               ) -> list[str]:
    """Send one order line (``"grow 2 a b"``, its words, or raw bytes, sent as they
    are) to a job listening at ``address``; return the reply lines (none from a job of the ElasticJobScheduler).

    The order is signed with ``secret`` (:mod:`apgas.auth`); without one, with
    the key a job started by hand keeps for its port (:func:`apgas.auth.order_key_path`),
    if this user can read it; ``secret=""`` sends it plain (ElasticJobScheduler
    compatibility; raw bytes always go plain).

    The one client of the order protocol: the CLI below, the scheduler, the tests
    and the benchmarks use it. ``on_first_line`` is called as soon as the first
    reply line is in (the malleability benchmark times it). OSError if the job
    cannot be reached or stays silent ``timeout`` seconds."""
    line = order if isinstance(order, (str, bytes)) else " ".join(order)
    if secret is None:
        secret = _key_of(address[1])
    if secret and isinstance(line, str):
        line = auth.sign(secret, line)
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall((line if isinstance(line, bytes) else line.encode()) + b"\n")
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
            if on_first_line is not None and b"\n" in data:
                on_first_line()
                on_first_line = None
    return data.decode(errors="replace").splitlines()


def _key_of(port: int) -> str:
    try:
        return auth.read_secret(auth.order_key_path(port))
    except (OSError, auth.AuthError):
        return ""


def _found_key(port: int) -> str:
    """The key a job started by hand keeps for ``port``; else "" after saying on
    stderr that none was found, where, and what to pass: an order sent unsigned
    without a word is refused by a signing job with no hint why."""
    path = auth.order_key_path(port)
    try:
        return auth.read_secret(path)
    except FileNotFoundError:
        problem = "there is no such file"
    except (OSError, auth.AuthError) as e:
        problem = f"it cannot be read ({e})"
    print(f"python -m apgas.order: no key found for the job on port {port}: looked in {path} "
          f"(where a job started by hand on this machine by this user keeps its key: "
          f"$APGAS_RUNTIME_DIR/orders, else ~/.apgas/orders), and {problem}. Sending the order unsigned, "
          f"which only a job in APGAS_PLAIN_PROTOCOL mode takes: pass --key-file PATH with the "
          f"job's key (a scheduler's job: the key it was given in APGAS_JOB_SECRET), or --plain "
          f"to send unsigned without this note.", file=sys.stderr)
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apgas.order", description=__doc__.split("\n")[0])
    parser.add_argument("--to", required=True, metavar="HOST:PORT", help="where the job listens for orders")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the reply")
    parser.add_argument("--key-file", metavar="PATH",
                        help="the job's secret (default: the key a job started by hand on that "
                             f"port keeps in {auth.runtime_dir() / 'orders' / 'PORT.key'}; "
                             "$APGAS_RUNTIME_DIR decides the directory, else ~/.apgas)")
    parser.add_argument("--plain", action="store_true",
                        help="send the order unsigned (for a job in APGAS_PLAIN_PROTOCOL mode)")
    parser.add_argument("order", nargs=argparse.REMAINDER, help="grow N HOST..., shrink N, or status")
    ns = parser.parse_args(argv)
    if not ns.order:
        parser.error("no order given: grow N HOST..., shrink N or status")
    try:
        address = parse_address("--to", ns.to)
    except ConfigError as e:
        parser.error(str(e))
    try:
        secret = "" if ns.plain else auth.read_secret(ns.key_file) if ns.key_file else None
    except (OSError, auth.AuthError) as e:
        parser.error(f"cannot read the key file {ns.key_file}: {e}")
    if secret is None:
        secret = _found_key(address[1])
    try:
        lines = send_order(address, ns.order, ns.timeout, secret=secret)
    except OSError as e:
        print(f"cannot reach the job at {ns.to}: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 1 if lines and lines[0].startswith("error") else 0


if __name__ == "__main__":
    sys.exit(main())
