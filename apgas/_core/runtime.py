"""The runtime of one place: place table, task execution, finish and ``at``.

Place 0 also starts the other places, watches them, and shuts them down.
Every place runs one :class:`Runtime`; :func:`current` returns it.

Why one module of about 670 lines: every part of :class:`Runtime` (spawn
counting, finish, ``at``, the message handler and the place table updates of
grow and shrink) works on the same place table and finish counts under one
lock, and the order of those updates is what keeps a task from being lost
while places come and go. Split over files, that ordering would be harder to
read, not easier; the parts with a job of their own already live apart
(``finish``, ``transport``, ``pool``, ``serialization`` beside it in ``apgas._core``;
malleability, which builds on the runtime, in ``apgas._malleability``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from .._timeline.recorder import open_timeline
from ..errors import ApgasError, DeadPlaceError, MultipleException, NotRunningError, RemoteError
from . import serialization as ser
from .config import Config, parse_chaos
from .finish import HomeFinish, RemoteFinish
from .gate import Gate
from .heartbeat import parse_heartbeat
from .interrupts import Interrupted, Interrupts
from .limits import check_start
from .place import Place
from .pool import WorkerPool, blocking, on_pool_thread
from .replies import Channel, ReplyChannels, routing_id
from .signals import wait_slice
from .transport import MessageTooLarge, Transport

if TYPE_CHECKING:
    from launcher import Launcher, PlaceProcess


__all__ = ["Runtime", "current", "current_finish", "Finish"]

log = logging.getLogger("apgas.runtime")
T = TypeVar("T")

# message kinds
(JOIN, TABLE, TABLE_ACK, TASK, UNCOUNTED, IMMEDIATE, REPORT, AT, AT_REPLY, DEAD, SHUTDOWN,
 FENCE, LEFT, INTERRUPT, INTERRUPT_ACK, RESUME) = range(1, 17)
INTERRUPT_S = 0.5  # s place 0 waits for every place to have ended what it interrupted
QUIET_S = 0.3  # s a place waits for its interrupted threads to end before it answers
#: the API that spawns a task of each kind, as an error names it
_CALLS = {TASK: "apgas.async_at", UNCOUNTED: "apgas.uncounted_async_at",
          IMMEDIATE: "apgas.immediate_async_at"}


_ctx = threading.local()  # .finish: (home place, finish id) governing spawns of this thread,
# or a Finish not opened yet (see Finish.ref)
_runtime: Runtime | None = None


def current() -> Runtime:
    """The runtime of this process; raises if ``apgas.run`` is not active."""
    rt = _runtime
    if rt is None:
        raise NotRunningError("the APGAS runtime is not running here: call this inside "
                              "apgas.run(main) or a script started with python -m apgas")
    return rt


def current_finish() -> tuple[int, int] | None:
    """(home place, finish id) of the finish governing this thread's spawns, if any."""
    f = getattr(_ctx, "finish", None)
    return f.ref() if isinstance(f, Finish) else f


class _Pending:
    """A waiting ``at()`` call; a held lock is the cheapest one-shot wake-up. With a
    reply channel (``token``), the caller waits on its channel instead."""

    __slots__ = ("dst", "token", "_latch", "reply", "error")

    def __init__(self, dst: int, token: int = 0) -> None:
        self.dst = dst
        self.token = token
        self._latch = threading.Lock()
        self._latch.acquire()
        self.reply: tuple[memoryview, list[memoryview]] | None = None  # (body, buffers)
        self.error: BaseException | None = None

    def wait(self) -> None:
        while not self._latch.acquire(timeout=wait_slice() or -1):
            pass  # the main thread: a slice ended, Ctrl-C's handler has run

    def settle(self) -> None:
        try:
            self._latch.release()
        except RuntimeError:
            pass  # settled already (a reply raced with the place's death)


LOST_GRACE_S = 0.25  # s a place's process has to show it ended, once its link dropped
LEAVE_LINGER_S = 6.0  # s a leaving place may flush (it closes with a 5 s linger) before it exits


class Runtime:
    def __init__(self, place_id: int, host: str, secret: bytes, config: Config) -> None:
        self.id = place_id
        self.host = host
        self.pid = os.getpid()
        self.config = config
        self.here = Place(place_id, host)
        self.places: dict[int, Place] = {place_id: self.here}
        self.dead: set[int] = set()   # died (failure)
        self.left: set[int] = set()   # removed by a shrink (orderly)
        self.global_refs: dict[int, Any] = {}
        # called as fn(place_id, host, reason) when a place dies (see watch_deaths)
        self._death_watchers: list[Callable[[int, str, str], None]] = []
        self.place_locals: dict[tuple[int, int], Any] = {}
        self.stopped = threading.Event()
        self.stop_reason = ""
        self.interrupts = Interrupts()  # what runs for the program here (apgas._core.interrupts)
        #: place 0 of apgas.init: a Ctrl-C interrupts every place, which stay up
        self.keeps_places = False
        self._interrupt_acks: set[int] = set()
        self._fences: set[int] = set()  # places that will send this place nothing more
        self._leaving = False
        self._lock = threading.Lock()  # finish bookkeeping and the place table
        self._home: dict[int, HomeFinish] = {}
        self._remote: dict[tuple[int, int], RemoteFinish] = {}
        self._pending: dict[int, _Pending] = {}
        self._counter = itertools.count(1)
        self.pool = WorkerPool(config.threads, f"apgas-worker-p{place_id}")
        self.immediate = WorkerPool(config.immediate_threads, f"apgas-immediate-p{place_id}")
        chaos = parse_chaos(config.chaos) if config.chaos else None
        self.heartbeat = parse_heartbeat(config.heartbeat)
        # place 0 watches every place; a place watches place 0 (it declares deaths)
        self.transport = Transport(place_id, secret, config.interface, self._on_message, chaos,
                                   config.max_message_bytes, self.heartbeat, self._link_lost,
                                   lambda other: place_id == 0 or other == 0,
                                   same_host=config.same_host)
        # a pool thread about to wait sends what its tasks left in batches (apgas._core.batch)
        self.pool.before_wait = self.immediate.before_wait = self.transport.flush
        self.replies = ReplyChannels(self.transport)  # apgas._core.replies
        self.transport.on_close.append(self.replies.close)
        # place 0 only
        self._children: dict[int, PlaceProcess] = {}
        self._joined: dict[int, tuple[str, int, str]] = {}
        self._secret = secret
        self._next_place = place_id + 1
        self._leaving_places: set[int] = set()
        self.gate = Gate()  # place 0: keeps orders out of steps (apgas._core.gate)
        self.launcher: Launcher | None = None  # place 0: starts the places of a grow
        self._table: dict[int, tuple[str, str, int]] = {place_id: (host, self.transport.endpoint, self.pid)}
        self._acks: set[int] = set()
        self._epoch = 0
        self._cond = threading.Condition(self._lock)
        # place 0 with APGAS_TIMELINE: the run's timeline (apgas._timeline.recorder); else None
        try:
            self.timeline = open_timeline(config, host) if place_id == 0 else None
        except BaseException:
            self.close()  # the file could not be opened: free the sockets and threads
            raise
        if self.timeline is not None:
            self.timeline.write("join", place=place_id, host=host)

    def next_id(self) -> int:
        return next(self._counter)

    # -- the place table ------------------------------------------------------
    def resolve(self, place: Place | int) -> int:
        """The id of a live place, or ``DeadPlaceError`` at once."""
        try:
            pid = place.id if isinstance(place, Place) else int(place)
        except (TypeError, ValueError):
            raise TypeError(f"expected a Place or a place id, got {place!r}") from None
        if pid not in self.places:
            why = ("it has died" if pid in self.dead else
                   "it has left (shrink): a place list read before an order went stale; read "
                   "apgas.places() inside `with step:` of apgas.steps, where orders wait for "
                   "the step's end" if pid in self.left else "no such place")
            raise DeadPlaceError(pid, f"{why}; live places are {sorted(self.places)}")
        return pid

    def sorted_places(self) -> list[Place]:
        return [self.places[i] for i in sorted(self.places)]

    def place(self, place_id: int) -> Place:
        return self.places[self.resolve(place_id)]

    # -- spawning -------------------------------------------------------------
    def spawn(self, place: Place | int, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], kind: int) -> None:
        """Start ``fn`` at ``place``: ``kind`` is TASK (counted), UNCOUNTED or IMMEDIATE."""
        if not callable(fn):
            raise TypeError(f"a task must be callable, got {fn!r}")
        dst = self.resolve(place)
        # the finish that counts the task: set exactly when it is a TASK
        fref = current_finish() if kind == TASK else None
        if kind == TASK and fref is None:
            kind = UNCOUNTED  # no finish governs this thread: nobody could wait for it
        if fref is not None:
            self._count_spawn(fref, dst, 1)
        self._start(fref, dst, fn, args, kwargs, kind, _CALLS.get(kind, "apgas.async_at"))

    def spawn_under(self, fref: tuple[int, int], place: Place | int, fn: Callable[..., Any],
                    args: tuple[Any, ...]) -> bool:
        """Spawn a counted task of the finish ``fref``, whose home is this place, from any
        thread; False (nothing spawned) if that finish has ended already.

        For a library that must add work to a running computation from a thread of its
        own (GLB restoring a dead place's work): checking that the finish still runs and
        counting the task happen under one lock, so the finish cannot end in between."""
        home, fid = fref
        if home != self.id:
            raise ApgasError(f"spawn_under needs a finish whose home is this place ({self.id}), "
                             f"not {fref}")
        dst = self.resolve(place)
        with self._lock:
            f = self._home.get(fid)
            if f is None or f.done.is_set():
                return False
            f.bump(self.id, dst, 1)
        self._start(fref, dst, fn, args, {}, TASK)
        return True

    def _start(self, fref: tuple[int, int] | None, dst: int, fn: Callable[..., Any],
               args: tuple[Any, ...], kwargs: dict[str, Any], kind: int,
               call: str = "spawn_under") -> None:
        """Send or queue a task whose spawn is counted already (if ``fref``);
        ``call`` is the API the user called, for an error that names it."""
        # pickled exactly when the task goes to another place
        try:
            payload = None if dst == self.id else ser.dumps_call(call, dst, fn, args, kwargs)
        except BaseException:  # not picklable: the task is not sent, take the count back
            if fref is not None:
                self._count_spawn(fref, dst, -1)
            raise
        if payload is not None:
            # The table is checked under the link's lock, which also orders the FENCE
            # that a shrink sends: no task reaches a place after its fence.
            try:
                sent = self.transport.send(dst, kind, *(fref or (0, 0)), payload,
                                           guard=lambda: dst in self.places,
                                           batch=kind != IMMEDIATE)
            except BaseException:  # MessageTooLarge: nothing sent, take the count back
                if fref is not None:
                    self._count_spawn(fref, dst, -1)
                raise
            if not sent:
                if fref is not None:
                    self._count_spawn(fref, dst, -1)
                raise DeadPlaceError(dst, "it died or left while the task was prepared")
        elif fref is not None:
            self.pool.submit(functools.partial(self._run_task, fref, self.id, fn, args, kwargs,
                                               self.interrupts.stamp()))
        else:
            pool = self.immediate if kind == IMMEDIATE else self.pool
            pool.submit(functools.partial(self._run_uncounted, fn, args, kwargs,
                                          self.interrupts.stamp()))

    def _count_spawn(self, fref: tuple[int, int], dst: int, delta: int) -> None:
        """Count a spawn (or take one back) before the task can possibly end."""
        home, fid = fref
        with self._lock:
            if home == self.id:
                self._home[fid].bump(self.id, dst, delta)
            else:
                state = self._remote[fref]
                state.spawned[dst] = state.spawned.get(dst, 0) + delta
                if dst == self.id:
                    state.live += delta

    def _run_task(self, fref: tuple[int, int], src: int, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], stamp: int) -> None:
        prev = getattr(_ctx, "finish", None)
        _ctx.finish = fref
        exc: Exception | None = None
        try:
            self.interrupts.run(stamp, fn, *args, **kwargs)
        except BaseException as e:
            exc = self.capture(e, portable=fref[0] != self.id)
        finally:
            _ctx.finish = prev
        self._task_done(fref, src, exc)

    def _run_remote_task(self, fref: tuple[int, int], src: int, body: memoryview,
                         buffers: list[memoryview], stamp: int) -> None:
        try:
            fn, args, kwargs = ser.loads(body, buffers)
        except BaseException as e:
            self._task_done(fref, src, self.capture(e, portable=fref[0] != self.id))
            return
        self._run_task(fref, src, fn, args, kwargs, stamp)

    def _run_uncounted(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                       stamp: int) -> None:
        prev = getattr(_ctx, "finish", None)
        _ctx.finish = None
        try:
            self.interrupts.run(stamp, fn, *args, **kwargs)
        except Interrupted:
            log.debug("uncounted task %r interrupted", fn)
        except BaseException:
            log.exception("uncounted task %r failed", fn)
        finally:
            _ctx.finish = prev

    def _run_remote_uncounted(self, body: memoryview, buffers: list[memoryview], stamp: int) -> None:
        try:
            fn, args, kwargs = ser.loads(body, buffers)
        except BaseException:
            log.exception("an uncounted task could not be unpickled")
            return
        self._run_uncounted(fn, args, kwargs, stamp)

    def _task_done(self, fref: tuple[int, int], src: int, exc: Exception | None) -> None:
        home, fid = fref
        with self._lock:
            if home == self.id:
                f = self._home.get(fid)
                if f is None:
                    log.debug("task of finished or unknown finish %s ended", fref)
                    return
                f.bump(src, self.id, -1)
                if exc is not None:
                    f.exceptions.append(exc)
                f.check()
                return
            state = self._remote.get(fref)
            if state is None:
                return  # the finish's home died meanwhile
            state.complete(src)
            if exc is not None:
                state.exceptions.append(exc)
            state.live -= 1
            if state.live == 0:
                del self._remote[fref]
                # sent under the lock: reports of this place leave in order
                payload = ser.dumps((state.spawned, state.completed, state.exceptions))
                try:
                    self.transport.send(home, REPORT, home, fid, payload, batch=True)
                except MessageTooLarge as e:  # the counts must arrive, or the finish hangs
                    err = ApgasError(f"{len(state.exceptions)} task exception(s) too large to report: {e}")
                    payload = ser.dumps((state.spawned, state.completed, [self.capture(err, True)]))
                    self.transport.send(home, REPORT, home, fid, payload)

    def capture(self, exc: BaseException, portable: bool) -> Exception:
        """Note where ``exc`` was raised; make it picklable if it must travel."""
        text = "".join(traceback.format_exception(exc))
        if not isinstance(exc, Exception):
            exc = RemoteError(type(exc).__qualname__, str(exc), text)
        note = f"raised at place {self.id} (host {self.host}, pid {self.pid})"
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        if not portable:
            return exc
        try:
            # an attribute of our own on any exception (the type system knows none such)
            exc.remote_traceback = text  # type: ignore[attr-defined]
            exc.add_note("remote traceback:\n" + text.rstrip())
            body, *buffers = ser.dumps(exc)
            clone = ser.loads(body, buffers)
            if type(clone) is not type(exc):
                raise TypeError("exception does not survive pickling")
            return exc
        except Exception:
            standin = RemoteError(type(exc).__qualname__, str(exc), text)
            for n in getattr(exc, "__notes__", ()):
                standin.add_note(n)
            return standin

    # -- finish -----------------------------------------------------------------
    def open_finish(self) -> HomeFinish:
        f = HomeFinish(self.next_id())
        with self._lock:
            self._home[f.fid] = f
        return f

    def wait_finish(self, f: HomeFinish) -> list[Exception]:
        with self._lock:
            f.body_done = True
            f.check()
        if not f.done.is_set():
            self.transport.flush()  # tasks that wait to leave in a batch leave now
            with blocking():
                while not f.done.wait(wait_slice()):
                    pass  # the main thread: a slice ended, Ctrl-C's handler has run
        with self._lock:
            self._home.pop(f.fid, None)
        return f.exceptions

    # -- interrupts (a Ctrl-C at place 0 of apgas.init) -----------------------------
    def interrupt(self) -> None:
        """Place 0: interrupt what runs for the program at every place, drop what
        waits to run, and keep the places (apgas._core.interrupts); within about
        INTERRUPT_S. The calling thread, whose wait was interrupted, is spared."""
        me = threading.get_ident()
        self.interrupts.begin(spare=me)
        others = [p for p in self.places if p != self.id]
        with self._cond:
            self._interrupt_acks = set()
        for p in others:
            self.transport.send(p, INTERRUPT, self.interrupts.epoch, 0)
        self.transport.flush()
        deadline = time.monotonic() + INTERRUPT_S
        self.interrupts.wait_quiet(QUIET_S, spare=me)
        with self._cond:
            while not self._interrupt_acks.issuperset(p for p in others if p in self.places):
                left = deadline - time.monotonic()
                if left <= 0:
                    late = sorted(set(others) - self._interrupt_acks)
                    log.warning("place(s) %s did not end what was interrupted within %.1f s; "
                                "it may still run there", late, INTERRUPT_S)
                    break
                self._cond.wait(left)
        for p in others:
            self.transport.send(p, RESUME, 0, 0)
        self.transport.flush()
        self.interrupts.end()

    def _answer_interrupt(self, epoch: int) -> None:
        """At a place: once the interrupted threads ended (or QUIET_S passed), say so."""
        if not self.interrupts.wait_quiet(QUIET_S):
            log.warning("place %d: code interrupted by place 0 still runs after %.1f s "
                        "(a long call in C sees the interrupt when it returns)", self.id, QUIET_S)
        self.transport.send(0, INTERRUPT_ACK, epoch, 0)

    def interrupted(self, exc: BaseException) -> None:
        """A wait of the program at place 0 ended by ``exc``: with a Ctrl-C in the main
        thread of apgas.init's place 0, interrupt every place (once per Ctrl-C)."""
        if self.keeps_places and isinstance(exc, KeyboardInterrupt) and self.id == 0 \
                and threading.current_thread() is threading.main_thread() \
                and not getattr(exc, "_apgas_interrupted", False):
            try:
                exc._apgas_interrupted = True  # type: ignore[attr-defined]
            except AttributeError:
                pass
            self.interrupt()

    # -- at ---------------------------------------------------------------------
    def at(self, place: Place | int, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any],
           immediate: bool = False) -> T:
        """``apgas.at``; with ``immediate``, ``fn`` runs on the target's immediate pool
        (for short control calls that must not queue behind busy workers)."""
        if self.guarded(getattr(_ctx, "finish", None)):
            with self.gate.hold():  # arrays follow the places: no order under this call
                return self._at(place, fn, args, kwargs, immediate)
        return self._at(place, fn, args, kwargs, immediate)

    def guarded(self, prev: object) -> bool:
        """Whether a finish or ``at`` opened under ``prev`` holds the gate: at place 0,
        while arrays follow the places, at the top level of the program's own code."""
        return self.id == 0 and bool(self.gate.guards) and _top_level(prev)

    def _at(self, place: Place | int, fn: Callable[..., T], args: tuple[Any, ...],
            kwargs: dict[str, Any], immediate: bool) -> T:
        dst = self.resolve(place)
        if dst == self.id:
            with Finish(solo=True):
                return fn(*args, **kwargs)
        call = "apgas.lowlevel.immediate_at" if immediate else "apgas.at"
        payload = ser.dumps_call(call, dst, fn, args, kwargs)
        req = self.next_id()
        # an immediate call runs on a thread that does not receive: its reply takes the link
        channel = None if immediate else self.replies.mine()
        endpoint = self.transport.endpoint_of(dst)
        held = False
        try:  # a Ctrl-C from here on may come after the call left: it is stopped there
            if channel is not None:
                held = channel.lock.acquire()  # this thread's own, until the reply is in
                if channel.closed or endpoint is None:
                    held = False
                    channel.lock.release()
                    channel = None
                else:
                    channel.reach(endpoint, dst)  # connected before the call leaves: the reply comes here
            pending = _Pending(dst, channel.token if channel is not None else 0)
            with self._lock:
                self._pending[req] = pending
            if not self.transport.send(dst, AT, pending.token << 1 | int(immediate), req, payload,
                                       guard=lambda: dst in self.places):  # see spawn()
                raise DeadPlaceError(dst, "it died or left before at() could be sent")
            self.transport.flush()
            self._await_reply(pending, req, channel)
        except KeyboardInterrupt as e:
            self.interrupted(e)
            raise
        finally:
            if held:
                channel.lock.release()  # type: ignore[union-attr]
            with self._lock:
                self._pending.pop(req, None)
        if pending.error is not None:
            raise pending.error
        assert pending.reply is not None, "settled without an error: the reply has come"
        ok, value = ser.loads(*pending.reply)
        if not ok:
            raise value
        return cast(T, value)  # what fn returned at dst, unpickled

    def _await_reply(self, pending: _Pending, req: int, channel: Channel | None) -> None:
        """Wait for the reply on this thread's channel, or for the receiving thread to settle
        ``pending``; either way ``pending`` holds the reply or an error after."""
        if channel is None:
            with blocking():
                pending.wait()
            return
        with blocking():
            reply = channel.wait(pending.dst, AT_REPLY, req,
                                 lambda: pending.error is not None or pending.reply is not None)
        if reply is not None:
            pending.reply = reply
        elif pending.reply is None and pending.error is None:
            pending.error = ApgasError(f"the runtime of place {self.id} closed while at() "
                                       f"waited for place {pending.dst}")

    def _serve_at(self, src: int, token: int, req: int, body: memoryview,
                  buffers: list[memoryview], stamp: int) -> None:
        fn: Any = None
        try:
            fn, args, kwargs = ser.loads(body, buffers)
            with Finish(solo=True):
                value = self.interrupts.run(stamp, fn, *args, **kwargs)
            reply = (True, value)
        except BaseException as e:
            reply = (False, self.capture(e, portable=True))
        err: Exception
        try:
            self._reply(src, token, req, ser.dumps(reply))
            return
        except MessageTooLarge as e:
            err = ApgasError(f"the value returned by at() is too large to send back: {e}")
        except Exception as e:  # the same words as for an argument (ser.dumps_call)
            err = ser.unpicklable(e, f"apgas.at(place {self.id}, {ser.function_name(fn)})",
                                  "its return value" if reply[0] else "its exception", reply[1])
        self._reply(src, token, req, ser.dumps((False, self.capture(err, portable=True))))

    def _reply(self, src: int, token: int, req: int, payload: Sequence[Any]) -> None:
        """Straight to the caller's reply channel if this thread still receives for the
        place and the channel is connected; else by the link (apgas._core.replies)."""
        if token and self.transport.reply_local(src, token, AT_REPLY, token, req, payload):
            return  # the caller is of this host: its channel's own stream, from any thread
        if token and self.pool.while_receiving(
                lambda: self.transport.route(src, routing_id(token), AT_REPLY, token, req, payload)):
            return
        self.transport.send(src, AT_REPLY, token, req, payload)

    # -- messages (the receiving thread, one at a time) ------------------------------
    def _on_message(self, kind: int, src: int, a: int, b: int, body: memoryview,
                    buffers: list[memoryview]) -> None:
        if kind == TASK:
            fref = (a, b)
            if a != self.id:
                with self._lock:
                    state = self._remote.get(fref)
                    if state is None:
                        state = self._remote[fref] = RemoteFinish()
                    state.live += 1
            self.pool.submit(functools.partial(self._run_remote_task, fref, src, body, buffers,
                                               self.interrupts.stamp()))
        elif kind == UNCOUNTED:
            self.pool.submit(functools.partial(self._run_remote_uncounted, body, buffers,
                                               self.interrupts.stamp()))
        elif kind == IMMEDIATE:
            self.immediate.submit(functools.partial(self._run_remote_uncounted, body, buffers,
                                                    self.interrupts.stamp()))
        elif kind == REPORT:
            spawned, completed, exceptions = ser.loads(body, buffers)
            with self._lock:
                f = self._home.get(b)
                if f is None:
                    log.debug("report from place %d for ended finish %d ignored", src, b)
                    return
                f.apply_report(src, spawned, completed, exceptions)
                f.check()
        elif kind == AT:
            job = functools.partial(self._serve_at, src, a >> 1, b, body, buffers,
                                    self.interrupts.stamp())
            if a & 1:
                self.immediate.submit(job)
            else:
                # run by this thread if a worker takes over receiving: the reply is awaited.
                # Tasks are queued: a stream of them would wait for each new leader to wake
                self.pool.submit_received(job)
        elif kind == AT_REPLY:
            with self._lock:
                pending = self._pending.get(b)
            if pending is None:
                return
            if not pending.token:
                pending.reply = (body, buffers)
                pending.settle()
            elif not self.replies.forward(pending.token, src, AT_REPLY, b, [body, *buffers]):
                pending.reply = (body, buffers)  # the caller finds it at its next look
        elif kind == TABLE:
            epoch, table = ser.loads(body, buffers)
            self._install_table(table)
            self.transport.send(0, TABLE_ACK, epoch, 0)
        elif kind == LEFT:
            self.transport.disconnect(a)
        elif kind == FENCE:
            with self._cond:
                self._fences.add(src)
                self._cond.notify_all()
        elif kind == TABLE_ACK:
            with self._cond:
                if a == self._epoch:
                    self._acks.add(src)
                    self._cond.notify_all()
        elif kind == JOIN:
            endpoint, pid, host = ser.loads(body, buffers)
            with self._cond:
                self._joined[src] = (endpoint, pid, host)
                self._cond.notify_all()
        elif kind == DEAD:
            reason = ser.loads(body, buffers)
            self.place_died(a, reason)
        elif kind == SHUTDOWN:
            self.stop_reason = "place 0 asked this place to stop"
            self.stopped.set()
        elif kind == INTERRUPT:
            self.interrupts.begin()
            threading.Thread(target=self._answer_interrupt, args=(a,), daemon=True,
                             name=f"apgas-interrupt-p{self.id}").start()
        elif kind == INTERRUPT_ACK:
            with self._cond:
                self._interrupt_acks.add(src)
                self._cond.notify_all()
        elif kind == RESUME:
            self.interrupts.end()
        else:
            log.warning("unknown message kind %d from place %d ignored", kind, src)

    def _install_table(self, table: dict[int, tuple[str, str, int]]) -> None:
        """Adopt a new place table: link to new places; fence off removed ones.

        A FENCE follows every task and ``at`` this place ever sent to a removed
        place (the order within a pair holds, and spawns check the table under
        the same lock), so a leaving place that has a fence from every staying
        place knows that no more work can reach it. Replies and finish reports
        may still come; the link closes when the place has gone (LEFT).
        A place that died since the table was made stays dead: a table is built
        before its acknowledgements are awaited, and a death may come in between.
        """
        with self._lock:
            table = {pid: entry for pid, entry in table.items() if pid not in self.dead}
        for pid, (_host, endpoint, _) in table.items():
            if pid != self.id and pid not in self.places:
                self.transport.connect(pid, endpoint)
        with self._lock:
            removed = [pid for pid in self.places if pid not in table and pid != self.id]
            self.places = {pid: Place(pid, host) for pid, (host, _, _) in table.items()}
            if self.id not in table:
                self.places[self.id] = self.here  # leaving, but still here for its last tasks
            self.left.update(removed)
            for pid in removed:  # the link stays for replies and reports until it has gone
                self.transport.send(pid, FENCE, 0, 0)
        if self.id not in table and not self._leaving:
            self._leaving = True
            staying = set(table)
            threading.Thread(target=self._drain_and_leave, args=(staying,),
                             name="apgas-leave", daemon=True).start()

    def _drain_and_leave(self, staying: set[int]) -> None:
        """A removed place: wait for every fence, finish every task, then stop."""
        with self._cond:
            # a staying place that died meanwhile will send no fence: wait for the live ones
            self._cond.wait_for(lambda: staying - self.dead <= self._fences
                                or self.stopped.is_set())
        while not (self.pool.wait_idle(10.0) and self.immediate.wait_idle(0.1)):
            log.warning("leaving, still running tasks (moved away by nobody?)")
        log.info("drained; leaving the computation")
        self.stop_reason = "left the computation (shrink)"
        self.stopped.set()

    def place_died(self, place_id: int, reason: str) -> None:
        """Forget a dead place: fail what waits on it, never wait for it again."""
        with self._lock:
            if place_id in self.dead or place_id == self.id:
                return
            self.dead.add(place_id)
            places = dict(self.places)
            gone = places.pop(place_id, None)
            self.places = places
            for f in self._home.values():
                f.place_died(place_id, reason)
                f.check()
            for fref in [k for k in self._remote if k[0] == place_id]:
                del self._remote[fref]
            waiting = [p for p in self._pending.values() if p.dst == place_id]
        with self._cond:  # a leaving place may be waiting for its fence
            self._cond.notify_all()
        log.warning("place %d died: %s", place_id, reason)
        host = gone.host if gone is not None else self._table.get(place_id, ("?",))[0]
        if self.timeline is not None:
            self.timeline.write("leave", place=place_id, host=host, why="failed", reason=reason)
        for p in waiting:
            p.error = DeadPlaceError(place_id, f"it died during at(): {reason}")
            p.settle()
        self.transport.disconnect(place_id)
        for watcher in list(self._death_watchers):
            try:
                watcher(place_id, host, reason)
            except Exception:
                log.exception("a watcher of place deaths failed on the death of place %d", place_id)

    def watch_deaths(self, watcher: Callable[[int, str, str], None]) -> Callable[[], None]:
        """Call ``watcher(place_id, host, reason)`` once for each place that dies from now
        on (not for places that leave in a shrink); returns a function that stops it.

        It runs on the thread that learnt of the death (the link watcher, the child
        watcher or the receiving thread), after every waiting ``at`` has failed: it must
        not block or call other places; start a thread for longer work."""
        self._death_watchers.append(watcher)

        def stop() -> None:
            try:
                self._death_watchers.remove(watcher)
            except ValueError:
                pass
        return stop

    # -- start and stop -------------------------------------------------------------
    def start_places(self, hosts: list[str], launcher: Launcher, timeout: float) -> list[Place]:
        """Place 0: start one place per host, wait for all to join, send the table.

        On failure the started places are killed and the table stays as it was.
        """
        return self.admit_places(self.launch_places(hosts, launcher, timeout))

    def launch_places(self, hosts: list[str], launcher: Launcher, timeout: float) -> dict[int, str]:
        """Place 0: start one place per host and wait for all to join; ``{id: host}``.
        The places are not in the table yet (:meth:`admit_places`): a grow prepares
        them while a step runs. On failure the started places are killed."""
        self._check_limits(hosts, launcher)
        wanted: dict[int, str] = {}
        for host in hosts:
            pid = self._next_place
            self._next_place += 1
            try:
                self._children[pid] = launcher.launch(pid, host, self.bootstrap(pid, host),
                                                      self.config.python)
            except OSError as e:
                self._abort_children(wanted)
                raise ApgasError(f"place {pid} could not be started on host {host!r} "
                                 f"by the {launcher.name} launcher: {e}") from e
            wanted[pid] = host
        problem = self._await_joins(wanted, time.monotonic() + timeout, timeout)
        if problem:
            self._abort_children(wanted)
            raise ApgasError(problem)
        return wanted

    def admit_places(self, wanted: dict[int, str]) -> list[Place]:
        """Place 0: put places that joined (:meth:`launch_places`) in the table of every
        place. ApgasError (and the places are killed) if one has exited meanwhile."""
        gone = {pid: code for pid in wanted
                if (code := self._children[pid].poll()) is not None}
        if gone:
            self.abort_places(wanted)
            raise ApgasError(f"places {sorted(gone)} exited (codes {sorted(gone.values())}) after "
                             "they had joined, before they were added")
        for pid, host in wanted.items():
            endpoint, ppid, _ = self._joined[pid]
            self.transport.connect(pid, endpoint)
            self._table[pid] = (host, endpoint, ppid)
        self._publish_table()
        if self.timeline is not None:
            for pid, host in wanted.items():
                self.timeline.write("join", place=pid, host=host)
        return [self.places[pid] for pid in wanted if pid in self.places]

    def abort_places(self, wanted: dict[int, str]) -> None:
        """Place 0: kill places launched but not admitted (an order that failed after)."""
        self._abort_children(wanted)

    def _check_limits(self, hosts: list[str], launcher: Launcher) -> None:
        """LimitError, before any start, if the new places would pass a limit of the
        machine at place 0 (:mod:`apgas._core.limits`)."""
        local = len(hosts) if launcher.name == "local" else 0
        check_start(len(hosts), len(self._table) + len(hosts), local,
                    self.config.threads + self.config.immediate_threads)

    def bootstrap(self, place_id: int | None, host: str | None) -> dict[str, Any]:
        """Place 0: what a new place needs to join (it travels as one JSON line)."""
        return {
            "place": place_id, "host": host, "parent_endpoint": self.transport.endpoint,
            "secret": self._secret.hex(), "sys_path": list(sys.path),
            "config": {"threads": self.config.threads, "interface": self.config.interface,
                       "immediate_threads": self.config.immediate_threads,
                       "log_level": self.config.log_level, "chaos": self.config.chaos,
                       "max_message_bytes": self.config.max_message_bytes,
                       "heartbeat": self.config.heartbeat, "same_host": self.config.same_host},
        }

    def removable(self, place_id: int) -> bool:
        """False for places whose process this runtime does not own (mpiexec ranks)."""
        return place_id != 0 and getattr(self._children.get(place_id), "removable", True)

    def _await_joins(self, wanted: dict[int, str], deadline: float, timeout: float) -> str | None:
        """Wait until every wanted place has joined; else say why not. The deadline
        moves on while places join: a thousand places on two cores take longer than
        ``timeout`` in all, yet each joins within it of the one before."""
        joined = 0
        with self._cond:
            while True:
                missing = [pid for pid in wanted if pid not in self._joined]
                if not missing:
                    return None
                if len(wanted) - len(missing) > joined:
                    joined = len(wanted) - len(missing)
                    deadline = max(deadline, time.monotonic() + timeout)
                for pid in missing:
                    code = self._children[pid].poll()
                    if code is not None:
                        return (f"place {pid} on host {wanted[pid]!r} exited with code {code} "
                                f"before joining{_said(self._children[pid])}")
                if time.monotonic() >= deadline:
                    said = "".join(f"\nplace {p}{_said(self._children[p])}" for p in missing[:8])
                    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
                    return (f"places {missing[:8]}{more} (hosts {[wanted[p] for p in missing[:8]]}"
                            f"{more and ', ...'}) did not join within {timeout} s "
                            f"(APGAS_JOIN_TIMEOUT){' of the last that did' if joined else ''}{said}")
                self._cond.wait(0.05)

    def remove_places(self, ids: list[int]) -> list[str]:
        """Place 0: remove places in order. Each finishes its tasks, then exits.

        Returns their host names as given. Every place has the new table when
        this returns.
        """
        leaving = list(ids)
        hosts = [self._table[pid][0] for pid in leaving]
        for pid in leaving:
            self._leaving_places.add(pid)
        self._publish_table(removed=leaving)
        for pid in leaving:
            proc = self._children.get(pid)
            waited = 0.0
            while proc is not None:
                try:
                    code = proc.wait(timeout=10.0)
                except Exception:
                    waited += 10.0
                    log.warning("place %d still finishing its tasks after %.0f s", pid, waited)
                    continue
                if code != 0:
                    self.place_died(pid, f"it exited with code {code} while leaving")
                break
            if self.timeline is not None and pid not in self.dead:
                self.timeline.write("leave", place=pid, host=self._table[pid][0], why="shrink")
            self._children.pop(pid, None)
            self._table.pop(pid, None)
            self._leaving_places.discard(pid)
            if proc is not None:
                _reap(proc, 0)
            self.transport.disconnect(pid)
            for other in self.places:
                if other != self.id:
                    self.transport.send(other, LEFT, pid, 0)
        return hosts

    def _publish_table(self, removed: Sequence[int] = ()) -> None:
        """Place 0: send the table to every place and wait until all have it."""
        table = {pid: entry for pid, entry in self._table.items()
                 if pid not in self.dead and pid not in removed}
        with self._cond:
            self._epoch += 1
            epoch = self._epoch
            self._acks = set()
        others = [p for p in table if p != 0] + list(removed)
        payload = ser.dumps((epoch, table))
        for pid in others:
            self.transport.send(pid, TABLE, 0, 0, payload)
        deadline = time.monotonic() + self.config.join_timeout

        def settled(pid: int) -> bool:  # a removed place whose process ended acks nothing:
            # nobody else watches it (watch_children leaves it to remove_places, which follows)
            if pid in self._acks or pid in self.dead:
                return True
            proc = self._children.get(pid) if pid in removed else None
            return proc is not None and getattr(proc, "removable", True) and proc.poll() is not None
        with self._cond:
            while not all(settled(p) for p in others):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApgasError(f"places {sorted(set(others) - self._acks)} did not "
                                     "acknowledge the place table in time")
                self._cond.wait(min(left, 0.05))
        self._install_table(table)

    def _abort_children(self, pids: Iterable[int]) -> None:
        """Kill the places of a failed start; one line for those that would not go."""
        procs = [p for p in (self._children.pop(pid, None) for pid in pids) if p is not None]
        for proc in procs:
            _signal(proc)
        _reap_all(procs, 0.0)

    def watch_children(self) -> None:
        """Place 0: a thread that notices places whose process ended."""
        def watch() -> None:
            while not self.stopped.wait(0.05):
                for pid, proc in list(self._children.items()):
                    code = proc.poll()
                    # a place that was removed (or is being removed) is remove_places' to watch;
                    # checked after poll(): the removal may finish between the snapshot and here;
                    if pid in self._leaving_places or pid in self.left or pid not in self._table:
                        continue  # still joining: a failed start is start_places' to report
                    if code is not None and pid not in self.dead:
                        self._declare_dead(pid, f"its process exited with code {code}")
        threading.Thread(target=watch, name="apgas-watch", daemon=True).start()

    def _declare_dead(self, pid: int, reason: str) -> None:
        """Place 0: the place is dead; end its process if any is left, tell everyone."""
        proc = self._children.pop(pid, None)
        if proc is not None:
            _reap(proc, 0)
        self.place_died(pid, reason)
        payload = ser.dumps(reason)
        # Also joining places (in the table being published, which may still list the
        # dead place: they would wait on it forever) and leaving ones (one may be
        # waiting for the dead place's fence).
        for other in set(self.places) | set(self._table) | self._leaving_places:
            if other != self.id and other != pid:
                self.transport.send(other, DEAD, pid, 0, payload)

    def _link_lost(self, pid: int) -> None:
        """The link to ``pid`` dropped its connection (:mod:`apgas._core.heartbeat`): its
        heartbeat stopped, or its process ended. Place 0 gives the process a grace
        to show that it ended (a leaving place closes its socket up to its linger
        before it exits), and declares the place dead by silence only if it did not."""
        timeout = self.heartbeat[1] if self.heartbeat else 0.0
        silent = (f"no answer to heartbeats for {timeout:g} s: its host is unreachable or its "
                  f"process does not run (APGAS_HEARTBEAT={self.config.heartbeat})")
        if self.id != 0:
            def lose_place_zero() -> None:
                # place 0's SHUTDOWN comes on another connection: it may follow the drop
                if not self.stopped.wait(LOST_GRACE_S):
                    self.stop_reason = f"lost place 0: {silent}"
                    log.warning("stopping: %s", self.stop_reason)
                    self.stopped.set()
            if pid == 0 and not self.stopped.is_set():
                threading.Thread(target=lose_place_zero, name="apgas-lost-0", daemon=True).start()
            return
        threading.Thread(target=self._judge_loss, args=(pid, silent, timeout),
                         name=f"apgas-lost-{pid}", daemon=True).start()  # the watcher goes on

    def _judge_loss(self, pid: int, silent: str, timeout: float) -> None:
        proc = self._children.get(pid)
        grace = (LEAVE_LINGER_S + timeout) if pid in self._leaving_places else LOST_GRACE_S
        if proc is not None and getattr(proc, "removable", True):  # an mpiexec rank's handle
            # cannot say whether the rank ended: its silence decides
            try:
                proc.wait(timeout=grace)
                return  # it ended: watch_children or remove_places say how
            except Exception:
                pass
        if self.stopped.is_set() or pid in self.dead:
            return
        if pid in self._leaving_places:  # remove_places waits for its process: end it
            log.warning("place %d, leaving, fell silent: %s", pid, silent)
            if proc is not None:
                proc.kill()
        elif pid in self._table and pid in self.places:
            self._declare_dead(pid, silent)

    def shutdown(self) -> None:
        """Place 0: stop every place (within 2 s), then this runtime."""
        self.stopped.set()
        if self.timeline is not None:
            for pid in sorted(self.places):
                self.timeline.write("leave", place=pid, host=self.places[pid].host, why="end")
            self.timeline.close()
        for pid in list(self.places):
            if pid != self.id:
                self.transport.send(pid, SHUTDOWN, 0, 0)
        _reap_all(list(self._children.values()), 1.5)
        self._children.clear()
        self.close()

    def close(self) -> None:
        self.stopped.set()
        self.transport.close()
        self.pool.shutdown()
        self.immediate.shutdown()


def _said(proc: PlaceProcess) -> str:
    """What a place process wrote to stderr, for an error message."""
    last_error = getattr(proc, "last_error", None)
    text = last_error() if last_error is not None else ""
    return f"; it said:\n{text}" if text else ""


def _reap(proc: PlaceProcess, grace: float, quiet: bool = False) -> bool:
    """Wait ``grace`` seconds for a place process to exit, then kill it; close its pipe.
    False if it would not go (logged unless ``quiet``)."""
    gone = True
    try:
        proc.wait(timeout=grace)
    except Exception:
        try:
            proc.kill()
            proc.wait(timeout=1.0)
        except Exception as e:
            gone = False
            if not quiet:  # the text, not the exception: a kept record keeps no frame (nor proc)
                log.error("place process %s did not end within 1 s of SIGKILL: %s",
                          getattr(proc, "pid", "?"), repr(e))
    _close_stdin(proc)
    return gone


def _signal(proc: PlaceProcess) -> None:
    """SIGKILL a place process (already gone: nothing)."""
    try:
        proc.kill()
    except Exception:
        pass


def _reap_all(procs: list[PlaceProcess], grace: float) -> None:
    """:func:`_reap` every process within ``grace`` s in all; one line names those that
    would not go."""
    deadline = time.monotonic() + grace
    stuck = [proc for proc in procs
             if not _reap(proc, max(0.01, deadline - time.monotonic()), quiet=True)]
    if stuck:
        pids = [getattr(proc, "pid", "?") for proc in stuck[:8]]
        log.error("%d place process(es) could not be killed (pids %s%s)", len(stuck),
                  ", ".join(map(str, pids)), ", ..." if len(stuck) > 8 else "")


def _close_stdin(proc: PlaceProcess) -> None:
    stdin = getattr(proc, "stdin", None)
    if stdin is not None:
        try:
            stdin.close()
        except OSError:
            pass


def install(rt: Runtime | None) -> None:
    global _runtime
    _runtime = rt


def default_host() -> str:
    return socket.gethostname()


class Finish:
    """``with Finish():`` waits for every task spawned in its body, on any place.

    Task failures, and an exception of the body itself, are raised together as a
    :class:`MultipleException`. With ``solo=True`` (used by ``at`` and ``run``) a
    body exception alone is raised as itself.

    The finish is opened at its first spawn: a body that spawns nothing (most
    ``at`` calls) costs no bookkeeping at all.
    """

    __slots__ = ("_rt", "_f", "_prev", "_solo", "_gated")

    def __init__(self, solo: bool = False) -> None:
        self._solo = solo
        self._f: HomeFinish | None = None

    def __enter__(self) -> Finish:
        rt = self._rt = current()
        self._f = None
        self._prev = getattr(_ctx, "finish", None)
        # arrays follow the places: no order re-spreads them under a top-level finish
        self._gated = rt.guarded(self._prev) and rt.gate.enter()
        _ctx.finish = self  # opened by ref() at the first spawn of this thread
        return self

    def _abandon(self, exc: BaseException) -> None:
        """The finish ends without waiting: forget it (reports of its tasks are ignored)
        and, for a Ctrl-C at place 0 of apgas.init, interrupt its tasks everywhere."""
        if self._f is not None:
            with self._rt._lock:
                self._rt._home.pop(self._f.fid, None)
        self._rt.interrupted(exc)

    def ref(self) -> tuple[int, int]:
        """(home place, finish id), opening the finish if nothing was spawned yet."""
        if self._f is None:
            self._f = self._rt.open_finish()
        return self._rt.id, self._f.fid

    def __exit__(self, etype: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        _ctx.finish = self._prev
        try:
            if exc is not None and not isinstance(exc, Exception):
                self._abandon(exc)
                return False  # KeyboardInterrupt and friends: do not wait
            try:
                errors = list(self._rt.wait_finish(self._f)) if self._f is not None else []
            except BaseException as e:  # a Ctrl-C while it waited
                self._abandon(e)
                raise
        finally:
            if self._gated:
                self._rt.gate.exit()
        if exc is not None:
            errors.insert(0, exc)
        if not errors:
            return False
        if self._solo and exc is not None and len(errors) == 1:
            return False
        raise MultipleException(f"{len(errors)} exception(s) in finish", errors)


def _top_level(prev: object) -> bool:
    """Whether a finish opened under ``prev`` (the thread's governing finish) is at the
    top level of the program's own code: nothing encloses it but ``apgas.run``'s finish
    around ``main`` (or a local ``at``'s, itself at the top level). Pool threads run
    tasks and served ``at`` calls, parts of a computation that holds the gate at its
    root already (waiting there for an order that waits for that root would deadlock)."""
    return (prev is None or (isinstance(prev, Finish) and prev._solo and prev._prev is None)) \
        and not on_pool_thread()
