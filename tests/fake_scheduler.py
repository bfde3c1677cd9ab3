"""A scripted stand-in for the scheduler on a raw socket (no apgas, no scheduler package)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from orders import order

Script = Callable[[str, "FakeScheduler"], str | None]


class FakeScheduler:
    """Listens like the scheduler; ``script(message, self)`` gives the answer line
    (None: read the line and close the connection without answering;
    ``FakeScheduler.SILENT``: hold the connection open ``silence`` seconds, then
    close it, answering nothing) and may send the job orders with :meth:`later`."""

    SILENT = "<silent>"
    silence = 1.0

    def __init__(self, script: Script, job: tuple[str, int]) -> None:
        self.script = script
        self.job = job
        self.lines: list[str] = []
        self.replies: list[list[str]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = self.server.getsockname()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\n" not in data and (chunk := conn.recv(4096)):
                    data += chunk
                line = data.decode().strip()
                self.lines.append(line)
                answer = self.script(line.split(":")[0], self)
                if answer == self.SILENT:
                    time.sleep(self.silence)
                elif answer is not None:
                    conn.sendall(answer.encode() + b"\n")

    def later(self, *orders: str) -> None:
        """Send the job these orders one by one, from a thread (as the scheduler does)."""
        def send():
            for line in orders:
                self.replies.append(order(self.job, line))
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(30)

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self.server.close()

    def messages(self, prefix: str = "Evolving") -> list[str]:
        return [line.split(":")[0] for line in self.lines if line.startswith(prefix)]
