"""Complaints about clients in the log, which no client can flood or forge.

A server logs what a peer did wrong (a refused request, an eviction) at once,
then rate-limited per peer and in all (:class:`PeerLog`), and any text of the
client's goes through :func:`loggable` first: cut, with control characters
escaped, so that a flood cannot fill the disk and a newline cannot forge a line.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["loggable", "PeerLog", "RateLimited", "LOG_INTERVAL", "LOG_TEXT"]

LOG_INTERVAL = 10.0  # s: a repeated complaint is logged at most this often
LOG_TEXT = 200  # characters of a client's text that a log line shows


def loggable(text: str | bytes, limit: int = LOG_TEXT) -> str:
    """A client's ``text`` fit for one log line: at most ``limit`` characters, with
    the count of those cut, and control characters escaped (no forged lines)."""
    cut, unit = max(0, len(text) - limit), "bytes" if isinstance(text, bytes) else "characters"
    shown = text[:limit].decode("utf-8", errors="replace") if isinstance(text, bytes) else text[:limit]
    if not shown.isprintable():
        shown = shown.encode("unicode_escape").decode("ascii")
    return f"{shown}... ({cut} more {unit})" if cut else shown


class RateLimited:
    """Logs a complaint at once, then at most every LOG_INTERVAL s, with the count
    of those it kept quiet about."""

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self.logger, self.level = logger, level
        self._last = -LOG_INTERVAL
        self._quiet = 0
        self._lock = threading.Lock()

    def __call__(self, message: str, *args: object, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < LOG_INTERVAL:
                self._quiet += 1
                return
            quiet, self._quiet, self._last = self._quiet, 0, now
        if quiet:
            message += f" ({quiet} more like it in the last {LOG_INTERVAL:g} s not logged)"
        self.logger.log(self.level, message, *args, exc_info=exc_info)


class PeerLog:
    """Logs a complaint about a peer at once, then at most one per ``interval`` s
    for that peer, saying how many were not logged; and at most ``max_lines`` in
    all per ``interval`` (a flood from many addresses). It remembers the
    ``max_peers`` peers heard from last; a forgotten peer's unlogged count is
    said with the next line."""

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING, *,
                 interval: float = LOG_INTERVAL, max_peers: int = 1024, max_lines: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.level, self.interval = logger, level, interval
        self.max_peers, self.max_lines, self._clock = max_peers, max_lines, clock
        self._peers: collections.OrderedDict[str, list[float]] = collections.OrderedDict()
        self._window, self._lines, self._unsaid = -interval, 0, 0  # all peers
        self._lock = threading.Lock()

    def __call__(self, peer: str, message: str, *args: object) -> bool:
        """Log ``message % args`` about ``peer`` unless it spoke too often; True if logged."""
        now = self._clock()
        with self._lock:
            seen = self._peers.get(peer)
            if seen is not None:
                self._peers.move_to_end(peer)
            if now - self._window >= self.interval:
                self._window, self._lines = now, 0
            if (seen is not None and now - seen[0] < self.interval) or self._lines >= self.max_lines:
                if seen is None:
                    self._unsaid += 1
                else:
                    seen[1] += 1
                return False
            quiet = int(seen[1]) if seen is not None else 0
            self._peers[peer] = [now, 0]
            while len(self._peers) > self.max_peers:
                self._unsaid += int(self._peers.popitem(last=False)[1][1])
            unsaid, self._unsaid = self._unsaid, 0
            self._lines += 1
        text = message % args if args else message
        if quiet:
            text += f" ({quiet} more from {peer} in the last {self.interval:g} s not logged)"
        if unsaid:
            text += f" ({unsaid} more from other peers not logged)"
        self.logger.log(self.level, "%s", text)
        return True
