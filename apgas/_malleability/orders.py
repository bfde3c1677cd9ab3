"""Place 0's side of malleability: the handler's lifecycle, the orders, the
evolving program's own requests, and the places lost without an order.

Orders run one at a time under ``_order_lock``; disabling the handler,
releasing places and telling the handler of lost places take the same lock,
so they wait for an order in progress.
Every phase is timed, logged and reported to the scheduler
(``growTimeAPGAS;<n>;<ns>`` and the like). Outstanding grow requests and the
outcome of each order live under ``_changed``, which ``check_status`` waits on.

Why one module: orders, evolving calls and lost places share the order lock,
the state and the handler; apart, each part would reach into the others'.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import protocol
from .._core.place import Place
from .._core.runtime import Runtime
from .._core.runtime import current as runtime_current
from .._timeline.recorder import wall
from ..errors import ApgasError, DeadPlaceError
from ..evolving import REFUSED, GrowRequest
from ..malleable import MalleableCommunicator, MalleableHandler, OrderError, communicator_class

__all__ = ["Orders"]

ANSWER_WAIT = 15.0  # s for the scheduler's answer to a check (the communicator gives up at 10)
ORDER_WAIT = 30.0  # s beyond the join timeout for the order that carries out a check's answer

log = logging.getLogger("apgas.malleability")
T = TypeVar("T")

RIGID, MALLEABLE, DISABLED, CLOSED = "rigid", "malleable", "disabled", "closed"

_installed: Orders | None = None
"""Place 0's orders while ``apgas.run`` runs (the core does not know of them)."""


def install(orders: Orders | None) -> None:
    """Make ``orders`` this process's orders (``apgas.run`` at place 0), or none."""
    global _installed
    _installed = orders


def current(what: str) -> Orders:
    """Place 0's orders; ApgasError naming ``what`` and this place anywhere else."""
    orders = _installed
    if orders is None:
        raise ApgasError(f"{what}: malleability is steered from place 0, where orders are "
                         f"carried out; this is place {runtime_current().id}")
    return orders


class Orders:
    """Carries out grow and shrink orders through the registered handler."""

    def __init__(self, rt: Runtime, started_ns: int) -> None:
        self._rt = rt
        self.started_ns = started_ns  # apgas.run's start (monotonic ns): the timing lines count from it
        self._order_lock = threading.Lock()
        self._state = RIGID
        self._handler: MalleableHandler | None = None
        self.communicator: MalleableCommunicator | None = None
        self._changed = threading.Condition()
        self._requests: list[GrowRequest] = []  # outstanding, oldest first
        self._failures = 0  # orders that failed, for check_status to notice
        self._last_check: float | None = None  # under _check_lock
        self._check_lock = threading.Lock()
        # (place id, host, reason) of each lost place, for the apgas-place-lost thread
        self._lost: queue.SimpleQueue[tuple[int, str, str] | None] = queue.SimpleQueue()
        self._unwatch: Callable[[], None] | None = None
        self._listeners: list[Any] = []  # resize listeners, in the order they were added

    # -- resize listeners (apgas.lowlevel.on_resize) --------------------------------------
    def add_listener(self, listener: Any) -> Callable[[], None]:
        """Call ``listener.before_shrink(leaving)`` inside every shrink and release, after
        the handler's ``pre_shrink`` chose the places and before they are removed, and
        ``listener.after_grow(added)`` inside every grow, after the places joined and before
        the handler's ``post_grow``; ``listener.place_lost(places)``, if it has one, when
        places are lost without an order. All at place 0, under the order lock. A listener
        that raises fails the order (an OrderError, as a failing handler would). Returns a
        function that removes the listener."""
        with self._order_lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._order_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return remove

    def _tell_listeners(self, method: str, places: list[Place]) -> None:
        for listener in list(self._listeners):
            self._call(f"resize listener {listener!r} {method}", getattr(listener, method), list(places))

    # -- lifecycle --------------------------------------------------------------
    def listen(self) -> MalleableCommunicator:
        """Start the configured communicator (orders are refused until a handler comes)."""
        if self.communicator is None:
            cls = communicator_class(self._rt.config.communicator)
            self.communicator = cls(self, self._rt.config)
            self.communicator.start()
            threading.Thread(target=self._tell_losses, name="apgas-place-lost", daemon=True).start()
            self._unwatch = self._rt.watch_deaths(self._place_lost)
        return self.communicator

    def define(self, handler: MalleableHandler) -> MalleableCommunicator:
        if not isinstance(handler, MalleableHandler):
            raise TypeError(f"expected a MalleableHandler, got {handler!r}")
        with self._order_lock:
            if self._state != RIGID:
                raise ApgasError(f"a malleable handler cannot be registered now: the program is "
                                 f"{self._state} (a handler is registered once and never again)")
            communicator = self.listen()
            self._handler = handler
            self._state = MALLEABLE
        ready_ns = time.monotonic_ns() - self.started_ns
        communicator.report(protocol.READY)
        self._report("ready", len(self._rt.places), ready_ns)
        return communicator

    def disable(self) -> None:
        if self._rt.gate.held_here():
            raise ApgasError("disable_malleable_handler waits for an order in progress, which "
                             "waits for the step (or the finish) this is called in: call it "
                             "after the step")
        with self._order_lock:  # waits for an order in progress
            if self._state != MALLEABLE:
                raise ApgasError(f"no malleable handler to disable: the program is {self._state}")
            self._state = DISABLED
        self._refuse_all("the program disabled its malleable handler")
        assert self.communicator is not None
        self.communicator.report(protocol.NOT_MALLEABLE)

    def close(self) -> None:
        """End of the program: wait for an order in progress, then stop listening."""
        with self._order_lock:
            was, self._state = self._state, CLOSED
        if self._unwatch is not None:
            self._unwatch()
            self._lost.put(None)  # ends the apgas-place-lost thread
        self._refuse_all("the program ended")
        if self.communicator is not None:
            if was == MALLEABLE:
                self.communicator.report(protocol.NOT_MALLEABLE)
            self.communicator.stop()

    # -- orders (called by the communicator) ---------------------------------------
    def status(self) -> tuple[str, list[Place]]:
        return self._state, self._rt.sorted_places()

    def grow(self, n: int, hosts: list[str]) -> list[Place]:
        try:
            return self._grow(n, hosts)
        except OrderError:
            self._failed()  # wakes a check_status waiting for this order
            raise

    def shrink(self, n: int, released: Callable[[list[str]], None]) -> list[str]:
        try:
            return self._shrink(n, released)
        except OrderError:
            self._failed()
            raise

    def _grow(self, n: int, hosts: list[str]) -> list[Place]:
        self._check_max_places(n)
        if len(hosts) != n:
            raise OrderError(f"grow {n} needs {n} host name(s), got {len(hosts)}: {hosts}")
        # A host named twice gets two places, as in the Java runtime (EJS's scripts do that).
        with self._order_lock:
            handler = self._ready_handler()
            self._check_max_places(n)  # again: an order may have run meanwhile
            launcher = self._rt.launcher
            assert launcher is not None, "apgas.run gives place 0 its launcher before any order"
            # the places start while a step may run (a grow that fails never stops the steps);
            # they join the program through the gate, between two steps
            launched = time.monotonic_ns()
            try:
                joined = self._rt.launch_places(hosts, launcher, self._rt.config.join_timeout)
            except ApgasError as e:
                raise OrderError(f"no place was added: {e}") from e
            admitted = False
            try:
                with self._rt.gate.order():
                    start = time.monotonic_ns()
                    continued = self._rt.sorted_places()
                    self._call("pre_grow", handler.pre_grow, n)
                    t1 = time.monotonic_ns()
                    try:
                        added = self._rt.admit_places(joined)
                    except ApgasError as e:
                        raise OrderError(f"no place was added: {e}") from e
                    admitted = True
                    t2 = time.monotonic_ns()
                    try:
                        self._tell_listeners("after_grow", added)
                        self._call("post_grow", handler.post_grow, n, continued, added)
                    finally:
                        self._granted(added)
                    end = time.monotonic_ns()
            finally:
                if not admitted:
                    self._rt.abort_places(joined)
            t1 -= start - launched  # the places' start counts from their launch
            start = launched
        self._report_phases("Grow", "Start", n, start, t1, t2, end, [p.id for p in added])
        return added

    def _check_max_places(self, n: int) -> None:
        """OrderError unless ``n`` more places stay within ``max_places`` (APGAS_MAX_PLACES)."""
        have, limit = len(self._rt.places), self._rt.config.max_places
        if have + n > limit:
            raise OrderError(f"grow {n} refused: the program has {have} place(s) and may have at "
                             f"most {limit} (APGAS_MAX_PLACES), so {have + n} is too many; "
                             "nothing was started")

    def _shrink(self, n: int, released: Callable[[list[str]], None]) -> list[str]:
        with self._order_lock:
            handler = self._ready_handler()
            live = self._rt.sorted_places()
            if n >= len(live):
                raise OrderError(f"cannot shrink by {n}: the program has {len(live)} place(s) "
                                 "and place 0 always stays")
            fixed = [p.id for p in live if p.id != 0 and not self._rt.removable(p.id)]
            if n > len(live) - 1 - len(fixed):
                raise OrderError(f"cannot shrink by {n}: places {fixed} are mpiexec ranks, which "
                                 "stay until the job ends; only places started by a grow can leave")
            with self._rt.gate.order():
                start = time.monotonic_ns()
                chosen = self._call("pre_shrink", handler.pre_shrink, n)
                self._check_choice(n, chosen)
                self._tell_listeners("before_shrink", chosen)
                t1 = time.monotonic_ns()
                hosts = self._remove(chosen)
                t2 = time.monotonic_ns()
                try:
                    released(hosts)  # the communicator's: the hosts go back at once
                except Exception:
                    log.exception("the communicator's released(%s) callback failed; the places "
                                  "have left all the same", hosts)
                try:
                    self._call("post_shrink", handler.post_shrink, n, list(chosen))
                finally:
                    self._notify()
                end = time.monotonic_ns()
        self._report_phases("Shrink", "Stop", n, start, t1, t2, end, [p.id for p in chosen])
        return hosts

    def _remove(self, chosen: list[Place]) -> list[str]:
        """Stop the chosen places (as a shrink does) and return their hosts.

        OrderError if one of them was lost before it had left (it died): its host
        is reported lost (:meth:`_place_lost`), never released; the others left, and
        their hosts go back at once (``Evolving;Release``); ``post_shrink`` is not
        called, as after any failed order."""
        ids = [p.id for p in chosen]
        try:
            hosts = self._rt.remove_places(ids)
        except ApgasError as e:  # a chosen place died before it took the new table?
            buried = self._bury(chosen)
            raise OrderError(f"places {buried} died before they had left: they are lost, not "
                             f"released ({e})" if buried else
                             f"places {ids} could not be removed: {e}") from e
        lost = [p for p in chosen if p.id in self._rt.dead]
        if not lost:
            return hosts
        left = [host for p, host in zip(chosen, hosts, strict=True) if p not in lost]
        assert self.communicator is not None, "orders come through the communicator"
        for host in left:
            self.communicator.report(protocol.release(host))
        raise OrderError(f"places {lost} died before they had left: they are lost, not released"
                         + (f"; the others left and went back: {left}" if left else ""))

    def _bury(self, chosen: list[Place]) -> list[Place]:
        """After a failed removal, the chosen places whose process has ended with an
        error are dead: the runtime leaves the places it removes to that removal, so
        nobody else notices, and they would stay in the place table. Returns them."""
        buried = []
        for p in chosen:
            proc = self._rt._children.get(p.id)
            code = proc.poll() if proc is not None else None
            if code not in (None, 0):
                self._rt.place_died(p.id, f"its process exited with code {code} while it was "
                                          "being removed")
                buried.append(p)
        return buried

    # -- places lost without an order (see MalleableHandler.on_place_lost) --------------
    def _place_lost(self, place_id: int, host: str, reason: str) -> None:
        """The runtime's death watcher: it runs on a runtime thread and must not block,
        so the loss goes to the apgas-place-lost thread."""
        self._lost.put((place_id, host, reason))

    def _tell_losses(self) -> None:
        """The apgas-place-lost thread: each loss goes to the scheduler at once, and to
        the handler under the order lock, with the losses that came meanwhile."""
        while (loss := self._lost.get()) is not None:
            losses = [loss]
            more: tuple[int, str, str] | None = loss
            self._tell_scheduler(loss)
            with self._order_lock:
                while not self._lost.empty() and (more := self._lost.get()) is not None:
                    losses.append(more)
                    self._tell_scheduler(more)
                lost = [Place(pid, host) for pid, host, _ in losses]
                self._tell_lost_listeners(lost)
                self._tell_handler(lost)
            if more is None:
                return

    def _tell_scheduler(self, loss: tuple[int, str, str]) -> None:
        place_id, host, reason = loss
        log.info("telling the scheduler that place %d on %s was lost: %s", place_id, host, reason)
        try:
            assert self.communicator is not None, "losses are watched from listen() on"
            self.communicator.report(protocol.place_lost(host))
        except Exception:
            log.exception("could not tell the scheduler that place %d on %s was lost", place_id, host)

    def _tell_lost_listeners(self, places: list[Place]) -> None:
        for listener in list(self._listeners):
            told = getattr(listener, "place_lost", None)
            if told is None:
                continue
            try:
                told(list(places))
            except Exception:
                log.exception("resize listener %r place_lost(%s) failed", listener, places)

    def _tell_handler(self, places: list[Place]) -> None:
        handler = self._handler if self._state == MALLEABLE else None
        if handler is None:
            log.info("lost %s while the program is %s: no handler to tell", places, self._state)
            return
        try:
            handler.on_place_lost(places)
        except Exception:
            log.exception("the handler's on_place_lost(%s) failed; the program goes on", places)

    def order_failed(self, reason: str) -> None:
        """An order the scheduler announced (a check's ``expand``/``shrink``) could not
        be carried out: a ``check_status`` waiting for it returns at once."""
        log.warning("the scheduler's order failed: %s", reason)
        self._failed()

    def refused(self, n: int, reason: str) -> None:
        """The scheduler will not grant ``n`` of the outstanding places: refuse
        the newest requests until ``n`` is covered."""
        with self._changed:
            left = n
            for request in reversed(list(self._requests)):
                if left <= 0:
                    break
                left -= request.outstanding
                request._settle(REFUSED, reason)
                self._requests.remove(request)
            if left == n:
                log.warning("the scheduler refused %d place(s), but no request is outstanding", n)

    # -- the evolving program's side (apgas.request_grow, release_places, check_status) --
    def request_grow(self, n: int) -> GrowRequest:
        _check_count("request_grow", n)
        communicator = self._evolving("request_grow")
        request = GrowRequest(n)
        with self._changed:
            self._requests.append(request)
        if not communicator.answers_asks:  # the ElasticJobScheduler: grows come, or nothing
            if n > 1:
                log.warning("request_grow(%d): the ElasticJobScheduler grants one node per "
                            "request, so this request may stay pending", n)
            communicator.report(protocol.request(n))
            return request
        try:
            answer = communicator.ask(protocol.request(n))
        except ApgasError as e:
            self._refuse(request, str(e))
            raise
        answer.add_done_callback(lambda f: self._request_answered(request, f))
        return request

    def release(self, places: Sequence[Place | int]) -> list[str]:
        ids = self._release_ids(places)
        communicator = self._evolving("release_places")
        if self._rt.gate.held_here():  # inside a step: the places leave at its end
            hosts = [self._rt.places[i].host for i in ids]
            threading.Thread(target=self._release_later, args=(ids,), daemon=True,
                             name="apgas-release").start()
            log.info("release_places(%s) inside a step: carried out at the step's end", ids)
            return hosts
        return self._release(ids, communicator)

    def _release_later(self, ids: list[int]) -> None:
        try:
            assert self.communicator is not None
            self._release(ids, self.communicator)
        except Exception:
            log.exception("release_places(%s), asked inside a step, failed at its end", ids)

    def _release(self, ids: list[int], communicator: MalleableCommunicator) -> list[str]:
        with self._order_lock, self._rt.gate.order():
            try:
                handler = self._ready_handler()
            except OrderError as e:
                raise ApgasError(f"release_places: {e}") from None
            try:
                inspect.signature(handler.pre_shrink).bind(len(ids), [])
            except TypeError:
                raise ApgasError(f"release_places needs a handler whose pre_shrink takes the chosen "
                                 f"places: def pre_shrink(self, n, chosen=None); "
                                 f"{type(handler).__name__}.pre_shrink does not") from None
            self._release_ids(ids)  # again, under the lock: a shrink may have run meanwhile
            chosen = [self._rt.places[i] for i in ids]
            n = len(chosen)
            start = time.monotonic_ns()
            returned = self._call("pre_shrink", handler.pre_shrink, n, list(chosen))
            if returned is not None and sorted(getattr(p, "id", p) for p in returned) != sorted(ids):
                raise ApgasError(f"pre_shrink({n}, chosen) must move the work off the chosen places "
                                 f"{ids} and return them, returned {returned!r}; nothing was removed")
            try:
                self._tell_listeners("before_shrink", chosen)
            except OrderError as e:
                raise ApgasError(f"release_places: {e}; nothing was removed") from e
            t1 = time.monotonic_ns()
            hosts = self._remove(chosen)
            t2 = time.monotonic_ns()
            for host in hosts:
                communicator.report(protocol.release(host))
            try:
                self._call("post_shrink", handler.post_shrink, n, chosen)
            finally:
                self._notify()
            end = time.monotonic_ns()
        self._report_phases("Shrink", "Stop", n, start, t1, t2, end, ids)
        return hosts

    def check_status(self, low: int, high: int, preferred: int | None, factor: int) -> int:
        _check_sizes(low, high, preferred, factor)
        communicator = self._evolving("check_status")
        if not communicator.answers_asks:
            raise ApgasError("check_status: the ElasticJobScheduler answers no question; use "
                             "request_grow and release_places under it, or run under our "
                             "scheduler or Slurm (APGAS_COMMUNICATOR=slurm)")
        count = len(self._rt.places)
        inhibit = self._rt.config.check_inhibit
        with self._check_lock:  # check and set at once: of concurrent calls, one asks
            now = time.monotonic()
            if self._last_check is not None and now - self._last_check < inhibit:
                log.debug("check_status inhibited (%.2f s since the last, APGAS_CHECK_INHIBIT=%g)",
                          now - self._last_check, inhibit)
                return count
            self._last_check = now
        with self._changed:
            failures = self._failures
        line = protocol.check(low, high, preferred, factor)
        try:
            answer = communicator.ask(line).result(timeout=ANSWER_WAIT)
        except concurrent.futures.TimeoutError:
            reason = (f"the scheduler at {self._rt.config.scheduler} did not answer {line!r} "
                      f"within {ANSWER_WAIT} s")
        except Exception as e:  # the communicator's ApgasError names the scheduler
            reason = _ask_failure(e)
        else:
            reason = "" if answer.strip() else (f"the scheduler at {self._rt.config.scheduler} "
                                                f"gave no answer to {line!r}")
        if reason:
            log.warning("check_status: %s; the program keeps its %d place(s)", reason, count)
            raise ApgasError(f"{reason}; the program keeps its {count} place(s)")
        words = answer.split()
        if words == ["none"]:
            return len(self._rt.places)
        if words[0] == "error":
            raise ApgasError(f"the scheduler refused check_status({low}, {high}): {answer[6:]}")
        goal = protocol.ascii_int(words[1]) if len(words) == 2 else None
        if goal is None or words[0] not in ("expand", "shrink"):
            raise ApgasError(f"the scheduler answered {line!r} with {answer!r}; expected "
                             "'expand <k>', 'shrink <k>', 'none' or 'error <reason>'")
        if self._rt.gate.held_here():
            log.info("check_status inside a step: %r is carried out at the step's end", answer)
            return len(self._rt.places)
        deadline = self._rt.config.join_timeout + ORDER_WAIT
        with self._changed:
            arrived = self._changed.wait_for(
                lambda: len(self._rt.places) == goal or self._failures > failures, deadline)
            failed = self._failures > failures
        if not arrived:
            raise ApgasError(f"the scheduler answered {answer!r} but no order came within "
                             f"{deadline:g} s; the program keeps its {len(self._rt.places)} place(s)")
        if failed and len(self._rt.places) != goal:
            log.warning("check_status: the order for %r failed; %d place(s) stay", answer,
                        len(self._rt.places))
        return len(self._rt.places)

    def _evolving(self, call: str) -> MalleableCommunicator:
        """The communicator, if the program may ask: a handler is registered and a
        scheduler attached."""
        if self._state != MALLEABLE or self.communicator is None:
            raise ApgasError(f"{call}: the program is {self._state}; register a MalleableHandler "
                             "first (apgas.define_malleable_handler), since the scheduler's answer "
                             "is carried out through it")
        if not self.communicator.attached:
            raise ApgasError(f"{call}: no scheduler is attached (APGAS_SCHEDULER is not set); "
                             "evolving calls need the program to run as a job of a scheduler")
        return self.communicator

    def _release_ids(self, places: Sequence[Place | int]) -> list[int]:
        if isinstance(places, (Place, int)) or not isinstance(places, (list, tuple)) or not places:
            raise ValueError(f"release_places needs a non-empty list of places, got {places!r}")
        ids = [p.id if isinstance(p, Place) else p for p in places]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"release_places needs places or place ids, got {places!r}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"release_places names a place twice: {ids}")
        if 0 in ids:
            raise ValueError("release_places: place 0 runs main and always stays")
        for i in ids:
            if i not in self._rt.places:
                raise DeadPlaceError(i, "it is not a live place of this program, so it cannot "
                                        "be released")
            if not self._rt.removable(i):
                raise ValueError(f"release_places: place {i} is an mpiexec rank, which stays "
                                 "until the job ends; only places started by a grow can leave")
        return ids

    def _request_answered(self, request: GrowRequest, answer: concurrent.futures.Future[str]) -> None:
        """``ok``: queued; ``error``: refused; no answer at all (the scheduler closed
        the connection, or was silent for the communicator's answer timeout): refused,
        since nobody may have queued it. Anything else is taken as queued."""
        try:
            text = answer.result().strip()
        except Exception as e:  # the communicator's ApgasError names the scheduler
            self._refuse(request, _ask_failure(e))
            return
        if not text:
            self._refuse(request, f"the scheduler at {self._rt.config.scheduler} gave no answer "
                                  f"to Evolving;Request;{request.n}")
        elif text.startswith("error"):
            self._refuse(request, text[6:].strip())
        elif not text.startswith("ok"):
            log.warning("unexpected answer %r to a grow request; taking it as queued", text)

    def _refuse(self, request: GrowRequest, reason: str) -> None:
        """Refuse ``request`` unless it was settled meanwhile (its grows came first)."""
        with self._changed:
            if request.done():
                log.info("request for %d place(s) was settled (%s) before: %s", request.n,
                         request.state, reason)
                return
            request._settle(REFUSED, reason)
            if request in self._requests:
                self._requests.remove(request)
        log.warning("request for %d place(s) refused: %s", request.n, reason)

    def _refuse_all(self, reason: str) -> None:
        with self._changed:
            for request in self._requests:
                request._settle(REFUSED, reason)
            self._requests.clear()

    def _granted(self, added: list[Place]) -> None:
        """Count new places towards the outstanding requests, oldest first."""
        with self._changed:
            rest = list(added)
            for request in list(self._requests):
                rest = request._add(rest)
                if request.done():
                    self._requests.remove(request)
            self._changed.notify_all()

    def _failed(self) -> None:
        with self._changed:
            self._failures += 1
            self._changed.notify_all()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- helpers ----------------------------------------------------------------------
    def _ready_handler(self) -> MalleableHandler:
        if self._state == RIGID:
            raise OrderError("the program is not malleable yet: no MalleableHandler is registered")
        if self._state != MALLEABLE or self._handler is None:
            raise OrderError(f"the program is no longer malleable ({self._state})")
        return self._handler

    def _check_choice(self, n: int, chosen: object) -> None:
        live = self._rt.places
        dead = [p for p in chosen if isinstance(p, Place) and p.id in self._rt.dead] \
            if isinstance(chosen, (list, tuple)) else []
        if dead:
            raise OrderError(f"pre_shrink({n}) chose places {dead}, which died meanwhile: they "
                             "are lost, not released; nothing was removed")
        if (not isinstance(chosen, (list, tuple)) or len(chosen) != n
                or not all(isinstance(p, Place) for p in chosen)
                or len({p.id for p in chosen}) != n
                or any(not self._rt.removable(p.id) or p.id not in live for p in chosen)):
            raise OrderError(f"pre_shrink({n}) must return {n} distinct live places other than "
                             f"place 0 (and mpiexec ranks), returned {chosen!r}; nothing was removed")

    @staticmethod
    def _call(name: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except Exception as e:
            log.exception("the handler's %s failed", name)
            raise OrderError(f"the handler's {name} raised {type(e).__name__}: {e}") from e

    def _report_phases(self, verb: str, place_phase: str, n: int, start: int, t1: int, t2: int,
                       end: int, places: list[int]) -> None:
        """The handler's pre phase, the places' start or stop, the post phase, the whole
        (to the scheduler, the log, and the timeline with the places added or removed)."""
        phases = ((f"pre{verb}", start, t1), (f"place{place_phase}", t1, t2), (f"post{verb}", t2, end))
        for phase, since, until in phases:
            self._report(phase, n, until - since)
        self._report(verb.lower(), n, end - start)
        timeline = self._rt.timeline
        if timeline is not None:
            for phase, since, until in phases:
                timeline.phase(verb.lower(), phase, n, since, until - since)
            timeline.write("order", order=verb.lower(), n=n, start=wall(start),
                           seconds=(end - start) / 1e9, places=sorted(places))

    def _report(self, event: str, n: int, ns: int) -> None:
        line = protocol.timing(event, n, ns)
        log.info("%s: %d place(s) in %.3f s", line.split(";")[0], n, ns / 1e9)
        if self.communicator is not None:
            self.communicator.report(line)


def _ask_failure(e: BaseException) -> str:
    """Why an ask failed: the communicator's ApgasError already names the scheduler."""
    return str(e) if isinstance(e, ApgasError) else f"{type(e).__name__}: {e}"


def _check_count(call: str, n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{call} needs a positive number of places, got {n!r}")


def _size(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"check_status: {name} must be an integer >= 1, got {value!r}")
    return value


def _check_sizes(low: object, high: object, preferred: object, factor: object) -> None:
    low, high = _size("min", low), _size("max", high)
    _size("factor", factor)
    if low > high:
        raise ValueError(f"check_status: min {low} is above max {high}")
    if preferred is not None and (not isinstance(preferred, int) or isinstance(preferred, bool)
                                  or not low <= preferred <= high):
        raise ValueError(f"check_status: preferred must be None or between min {low} and "
                         f"max {high}, got {preferred!r}")
