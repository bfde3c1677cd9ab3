"""Orders for the tests (through the one order client, ``apgas.order.send_order``) and free ports."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import apgas
from apgas.order import send_order


def order(address, line: str | bytes, timeout: float = 60) -> list[str]:
    """Send one order line; return the reply lines (the job closes the connection)."""
    return send_order(address, line, timeout)


_WORKERS = 8  # pytest-xdist workers with port ranges of their own (gw0..gw7; more share)
_ORDER_PORT_BASE, _ORDER_PORT_COUNT = 27100, 1000  # apgas_scheduler.live.processes'
#: the plain jobs' order ports of each worker's schedulers (:func:`order_port_base`)
_SCHEDULER_ORDER_PORTS = range(_ORDER_PORT_BASE - (_WORKERS - 1) * _ORDER_PORT_COUNT,
                               _ORDER_PORT_BASE + _ORDER_PORT_COUNT + 1)


def worker_index() -> int:
    """This pytest-xdist worker's number (gw3: 3), 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdecimal() else 0


def order_port_base() -> int:
    """The order port base for this worker's schedulers: the plain jobs of two schedulers
    in two workers never pick the same port (each checks only that nothing listens yet)."""
    return _ORDER_PORT_BASE - (worker_index() % _WORKERS) * _ORDER_PORT_COUNT


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where port 0 and outgoing connections bind)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nobody listens on now, from below the ephemeral range.

    A test binds such a port later, in another process. A port found by binding
    port 0 is an ephemeral one, which any outgoing connection of a place, a
    ZeroMQ socket or another test may take in between ("Address already in
    use" under load); below the ephemeral range only an explicit bind can. Each
    pytest-xdist worker draws from its own residue class, so two never pick the same.
    """
    low = _ephemeral_low()
    pool = [p for p in range(max(1024, low - 12000), low)
            if p not in _SCHEDULER_ORDER_PORTS and p % _WORKERS == worker_index() % _WORKERS]
    rng = random.SystemRandom()
    found: list[int] = []
    while len(found) < count:
        port = rng.choice(pool)
        if port in found:
            continue
        try:
            with socket.create_server(("127.0.0.1", port)):
                pass
        except OSError:
            continue  # someone listens there
        found.append(port)
    return found


def free_port() -> int:
    return free_ports(1)[0]


def free_address() -> tuple[str, int]:
    """A loopback address nobody listens on now (see :func:`free_ports`)."""
    return "127.0.0.1", free_port()


def wait_malleable(address, stop: threading.Event | None = None, timeout: float = 60) -> bool:
    """Poll ``status`` until the job takes orders; False if ``stop`` is set first."""
    while not order(address, "status", timeout=timeout)[0].startswith("status malleable"):
        if stop is None:
            time.sleep(0.01)
        elif stop.wait(0.01):
            return False
    return True


def send_orders(address, lines, replies: list[list[str]], stop: threading.Event | None = None,
                timeout: float = 60) -> threading.Thread:
    """Start a daemon thread that waits until the job is malleable, then sends ``lines``
    one after the other, appending each reply to ``replies``."""
    def scheduler():
        if wait_malleable(address, stop, timeout):
            for line in lines:
                replies.append(order(address, line, timeout=timeout))

    client = threading.Thread(target=scheduler, daemon=True)
    client.start()
    return client


def random_orders(address, rng: random.Random, name: str, gate: str | None = None,
                  timeout: float = 60) -> tuple[threading.Thread, list[list[str]]]:
    """Start a scheduler thread: once the job takes orders, it sends 3 to 6 random orders
    (a shrink keeps at least place 0; a grow adds 1 or 2 places named ``<name>x<k>``),
    with random pauses, then creates the file ``gate`` (see ``glb_bags.GatedBag``), also
    when an order failed. Returns the thread and the list the replies go to."""
    replies: list[list[str]] = []

    def scheduler() -> None:
        try:
            if not wait_malleable(address, timeout=timeout):
                return
            grown = 0
            for _ in range(rng.randint(3, 6)):
                live = int(order(address, "status", timeout=timeout)[0].split()[2])
                if live > 1 and rng.random() < 0.5:
                    line = f"shrink {rng.randint(1, live - 1)}"
                else:
                    k = rng.randint(1, 2)
                    line = f"grow {k} " + " ".join(f"{name}x{grown + i}" for i in range(k))
                    grown += k
                replies.append(order(address, line, timeout=timeout))
                time.sleep(rng.random() * 0.05)
        finally:
            if gate is not None:
                open(gate, "a").close()

    thread = threading.Thread(target=scheduler, daemon=True)
    thread.start()
    return thread, replies


def orders_then_gate(address, lines, gate: str, timeout: float = 60
                     ) -> tuple[threading.Thread, list[list[str]]]:
    """:func:`send_orders`, then create the file ``gate`` (see ``glb_bags.GatedBag``),
    also when an order failed. Returns the thread and the list the replies go to."""
    replies: list[list[str]] = []

    def scheduler() -> None:
        try:
            if wait_malleable(address, timeout=timeout):
                for line in lines:
                    replies.append(order(address, line, timeout=timeout))
        finally:
            open(gate, "a").close()

    thread = threading.Thread(target=scheduler, daemon=True)
    thread.start()
    return thread, replies


class Newest(apgas.MalleableHandler):
    """Gives back the newest places (never place 0), as most users' handlers do."""

    def pre_shrink(self, n, chosen=None):
        if chosen is not None:
            return chosen
        return [p for p in apgas.places() if p.id != 0][-n:]
