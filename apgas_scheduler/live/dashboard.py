"""The scheduler's live page (``serve --dashboard HOST:PORT``): one HTML page,
kept current by server-sent events, drawn from the event log by :mod:`.views`.

Off by default; loopback by default when on. Every request must carry the
dashboard token, derived from the operator's key (:func:`.access.dashboard_token`),
so the page is the operator's as the client API is: ``python -m apgas_scheduler
dashboard-url`` prints the URL with the token, which the page trades for a
cookie (HttpOnly, SameSite=Strict) at once, so it leaves the address bar.
The page is read-only and fetches nothing but its own event stream.

What a page costs the daemon: a new model is computed only when events came
(at most every :data:`MIN_GAP` seconds) or, while a job runs, every
:data:`TICK` seconds so that its bars grow; all open pages share it. Both
gaps stretch to :data:`COST_FACTOR` times what the last model took to make,
so that a long log never takes more than a fifth of a core. At most
:data:`MAX_STREAMS` pages are served at once; the events kept for the page
are bounded by :data:`MAX_EVENTS` (the oldest go first, and the page says so).

What a client without the token costs it: a request head must come whole
within :data:`HEAD_DEADLINE` seconds and :data:`MAX_HEAD` bytes, however its
bytes trickle (the standard handler's timeout is per read, so a byte every few
seconds would hold a connection forever); and the connections are shared per
user (``serve_connections``), so a flood of slow ones evicts only its own while
the operator's browser is served.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hmac
import http.server
import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from apgas.serving import (
    CONTENT_SECURITY_POLICY,
    LineTooLong,
    PeerLog,
    connection_peer,
    loggable,
    read_head,
    render_page,
    serve_connections,
)

from .core import log
from .views import dashboard_model

__all__ = ["Dashboard", "dashboard_url", "MAX_STREAMS", "MAX_EVENTS", "TICK", "MIN_GAP"]

MAX_STREAMS = 8
MAX_CONNECTIONS = 32
PER_CLIENT = 16  # connections of one user (or address): the operator's streams and page loads
MAX_HEAD = 8192  # bytes of a request's line and headers
HEAD_DEADLINE = 5.0  # s from connecting to the end of the request's head
SEND_TIMEOUT = 10.0  # s a send to a page may block (a stalled browser)
MAX_EVENTS = 50_000  # about 25 MB; a model of that many takes a few seconds
TICK = 2.0  # s between models while something runs (bars grow with the clock)
MIN_GAP = 0.25  # s: events closer than this come in one model
COST_FACTOR = 5.0  # the gaps are at least this many times the cost of one model
KEEPALIVE = 15.0  # s: a comment on an idle stream, so that a dead page is noticed
COOKIE = "apgas_dashboard"


def dashboard_url(address: tuple[str, int], token: str) -> str:
    """The page's address with its token (an IPv6 host in brackets)."""
    host, port = address
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/?token={token}"


class Dashboard:
    """Serves the page of one scheduler; fed each event by :meth:`add`."""

    def __init__(self, address: tuple[str, int], token: str, clock: Callable[[], float],
                 events: Iterable[dict[str, Any]], title: str) -> None:
        self._token = token
        self._clock = clock
        self.title = title
        self._events: collections.deque[dict[str, Any]] = collections.deque(events, MAX_EVENTS)
        self._dropped = 0
        self._running: set[Any] = set()  # the jobs started and not ended
        for event in self._events:
            self._track(event)
        self._changed = threading.Condition()
        self._version = 0
        self._cache: tuple[int, float, str] = (-1, 0.0, "")  # version, made at, model JSON
        self._cost = 0.0  # s the last model took to make
        self._making = threading.Lock()
        self._streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._stopped = threading.Event()
        self.refused = PeerLog(log)  # per client: a flood of wrong tokens fills no disk
        self._server = socket.create_server(address)
        self.address: tuple[str, int] = (address[0], self._server.getsockname()[1])
        if address[0] not in ("127.0.0.1", "::1", "localhost"):
            log.warning("the dashboard listens on %s, beyond this machine: its token and the "
                        "jobs' names travel unencrypted (reach it through ssh -L instead)",
                        address[0])

    @property
    def url(self) -> str:
        return dashboard_url(self.address, self._token)

    # -- fed by the scheduler (under its lock: quick) --------------------------------------
    def add(self, event: dict[str, Any]) -> None:
        with self._changed:
            if len(self._events) == MAX_EVENTS:
                self._dropped += 1
            self._events.append(event)
            self._track(event)
            self._version += 1
            self._changed.notify_all()

    # -- the model -----------------------------------------------------------------------
    def model(self) -> str:
        """The current model as JSON: made again only when events came, or when
        :data:`TICK` has passed and something runs; shared by every page."""
        with self._making:
            version, made, text = self._cache
            with self._changed:
                current, events, dropped = self._version, None, self._dropped
                stale = version != current or (bool(self._running) and
                                               time.monotonic() - made >= self.tick)
                if stale:
                    events = list(self._events)
            if events is None:
                return text
            began = time.monotonic()
            subtitle = f"events before the last {MAX_EVENTS} not shown" if dropped else ""
            model = dashboard_model(events, now=self._clock(), title=self.title, subtitle=subtitle)
            model["live"] = {"stream": "/stream"}
            text = json.dumps(model, separators=(",", ":"), allow_nan=False)
            self._cost = time.monotonic() - began
            self._cache = (current, time.monotonic(), text)
            return text

    @property
    def tick(self) -> float:
        """s between models while a job runs and nothing else happens."""
        return max(TICK, COST_FACTOR * self._cost)

    @property
    def gap(self) -> float:
        """The least s between two models."""
        return max(MIN_GAP, COST_FACTOR * self._cost)

    def _changed_since(self, seen: int) -> bool:
        """Whether events came after model ``seen``, or the scheduler stops (under ``_changed``)."""
        return self._version != seen or self._stopped.is_set()

    def _track(self, event: dict[str, Any]) -> None:
        if event.get("event") in ("start", "adopt"):
            self._running.add(event.get("job"))
        elif event.get("event") == "end":
            self._running.discard(event.get("job"))

    # -- serving -------------------------------------------------------------------------
    def serve_forever(self) -> None:
        log.info("dashboard on http://%s:%d/ (open it with: python -m apgas_scheduler "
                 "dashboard-url)", *self.address)
        serve_connections(self._server, self._serve, name="dashboard",
                          max_connections=MAX_CONNECTIONS, per_peer=PER_CLIENT,
                          deadline=HEAD_DEADLINE, stopped=self._stopped.is_set)

    def close(self) -> None:
        self._stopped.set()
        with self._changed:
            self._changed.notify_all()
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()

    def _serve(self, conn: socket.socket, read_by: float) -> None:
        """Read the request's head whole (within the deadline and the bound), then let
        the standard handler answer it from memory."""
        try:
            head = read_head(conn, MAX_HEAD, read_by)
        except LineTooLong:
            with contextlib.suppress(OSError):
                conn.sendall(b"HTTP/1.0 431 Request Header Fields Too Large\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            return
        except OSError:  # too slow (TimeoutError), evicted for another client, gone
            return
        if head is None:
            return
        conn.settimeout(SEND_TIMEOUT)
        address = conn.getpeername() if conn.family != socket.AF_UNIX else ("", 0)
        _Handler(head, conn, address, self)

    def authorized(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self._token.encode())

    def open_stream(self) -> bool:
        """Take one of the :data:`MAX_STREAMS` streams; False if all are taken."""
        return self._streams.acquire(blocking=False)

    def stream(self, begin: Callable[[], None], write: Callable[[bytes], None]) -> None:
        """Send models to one page (whose stream :meth:`open_stream` took), after
        ``begin`` (the headers), until it goes or the scheduler stops."""
        try:
            begin()
            seen, quiet_since = -1, time.monotonic()
            while not self._stopped.is_set():
                with self._changed:
                    self._changed.wait_for(functools.partial(self._changed_since, seen),
                                           timeout=self.tick if self._running else KEEPALIVE)
                    version, running = self._version, bool(self._running)
                if self._stopped.is_set():
                    break
                if version != seen or running:
                    seen = version
                    write(b"data: " + self.model().encode() + b"\n\n")
                    quiet_since = time.monotonic()
                    self._stopped.wait(self.gap)  # a burst of events makes one model
                elif time.monotonic() - quiet_since >= KEEPALIVE:
                    write(b": keepalive\n\n")
                    quiet_since = time.monotonic()
        except OSError:
            pass  # the page went away
        finally:
            self._streams.release()


class _SocketWriter(io.BufferedIOBase):
    """The handler's ``wfile``: each write sent at once, whole."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._conn.sendall(data)
        return len(data)


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /, /stream and /model.json, with the token (cookie or ?token=); the
    request's head is read already (``head``), and there is no body."""

    server: Any  # the Dashboard
    protocol_version = "HTTP/1.0"
    server_version = "apgas-scheduler-dashboard"

    def __init__(self, head: bytes, conn: socket.socket, address: Any, dashboard: Dashboard) -> None:
        self._head = head
        super().__init__(conn, address, dashboard)  # type: ignore[arg-type]  # any server will do

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._head)
        self.wfile = _SocketWriter(self.request)

    @property
    def _peer(self) -> str:
        return connection_peer(self.request) or str(self.client_address[0])

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard %s: %s", self._peer, loggable(format % args))

    def _send(self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": kind, "Content-Length": str(len(body)),
                            "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _text(self, status: int, text: str) -> None:
        self._send(status, (text + "\n").encode(), "text/plain; charset=utf-8")

    def _cookie_token(self) -> str | None:
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    def do_GET(self) -> None:
        dashboard: Dashboard = self.server
        url = urlsplit(self.path)
        given = parse_qs(url.query).get("token", [None])[0]
        if given is not None:
            if not dashboard.authorized(given):
                dashboard.refused(self._peer, "dashboard: a wrong token from %s", self._peer)
                self._text(403, "403: this token is not the dashboard's; get the URL again "
                           "with: python -m apgas_scheduler dashboard-url")
                return
            self._send(303, b"", "text/plain", {"Location": url.path or "/", "Set-Cookie":
                       f"{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/"})
            return
        if not dashboard.authorized(self._cookie_token()):
            self._text(401, "401: this page is the scheduler operator's. Open the URL that "
                       "'python -m apgas_scheduler dashboard-url --dashboard HOST:PORT' prints "
                       "(it reads the operator's key).")
            return
        if url.path == "/":
            model = json.loads(dashboard.model())
            self._send(200, render_page(model).encode(), "text/html; charset=utf-8")
        elif url.path == "/model.json":
            self._send(200, dashboard.model().encode(), "application/json")
        elif url.path == "/stream":
            self._event_stream(dashboard)
        else:
            self._text(404, f"404: no page {url.path!r}; the dashboard is at /")

    def _event_stream(self, dashboard: Dashboard) -> None:
        def write(data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()

        if not dashboard.open_stream():
            self._text(503, f"503: {MAX_STREAMS} dashboard pages are open already, the most "
                       "this scheduler serves; close one")
            return
        def begin() -> None:
            self.send_response(200)
            for name, value in (("Content-Type", "text/event-stream"),
                                ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")):
                self.send_header(name, value)
            self.end_headers()

        dashboard.stream(begin, write)
