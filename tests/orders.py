"""Raw socket client for grow/shrink orders (plain sockets only, no apgas on this side)."""

from __future__ import annotations

import socket
import threading
import time


def order(address, line: str | bytes, end: bytes = b"\n", timeout: float = 60) -> list[str]:
    """Send one raw order line; return the reply lines (the job closes the connection)."""
    data = line.encode() if isinstance(line, str) else line
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall(data + end)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply.decode().splitlines()


def free_address() -> tuple[str, int]:
    """A loopback address nobody listens on right now."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        return server.getsockname()


def free_port() -> int:
    return free_address()[1]


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
