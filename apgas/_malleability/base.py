"""The two seams of malleability, as abstract classes: the program's handler and
the scheduler's communicator, and the runtime's side that a communicator calls.
Their public home is :mod:`apgas.malleable`; they live here so that the default
communicator (:mod:`apgas._malleability.socket_communicator`) and the registry of
communicators (:mod:`apgas.malleable`) build on them without an import cycle.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Protocol

from .._core.config import Config
from .._core.place import Place
from ..errors import ApgasError

__all__ = ["MalleableHandler", "OrderError", "Orders", "MalleableCommunicator"]

log = logging.getLogger("apgas.malleable")


class MalleableHandler(abc.ABC):
    """What a program does around a change of its places.

    Subclass it, implement :meth:`pre_shrink` (the one abstract method), override
    the other hooks as needed, and register an instance at place 0 with
    ``apgas.define_malleable_handler``. All calls run at place 0, one order at a
    time (never two hooks at once), on the thread that carries out the order
    (the communicator's, or the program's own for ``release_places``), and may
    use every APGAS construct.

    A hook that raises fails its order: the communicator's ``orders.grow`` or
    ``orders.shrink`` raises :class:`OrderError` naming the hook and the
    exception (the scheduler gets ``error <reason>``). An exception in
    ``pre_grow`` or ``pre_shrink`` changes nothing; one in ``post_grow`` or
    ``post_shrink`` comes after the places changed, which stays so.
    """

    @abc.abstractmethod
    def pre_shrink(self, n: int, chosen: list[Place] | None = None) -> list[Place]:
        """Choose ``n`` places to release (never place 0), move their work away, return them.

        Called first on a shrink order for ``n`` places. Return a list of ``n``
        distinct live places other than place 0; anything else fails the order
        and nothing is removed. Once it returns, every place gets the new place
        table (``async_at`` to the chosen places then raises ``DeadPlaceError``),
        each chosen place runs the tasks it still has to their end and stops,
        their hosts go back to the scheduler, and :meth:`post_shrink` is called.

        ``chosen`` is given when the program released places itself
        (``apgas.release_places``): move their work away and return them.
        A handler without the ``chosen`` parameter serves scheduler orders only."""

    def post_shrink(self, n: int, removed: list[Place]) -> None:
        """Called once the ``removed`` places have stopped and their hosts went back to
        the scheduler (the communicator's ``released`` callback ran). They are no
        longer in ``apgas.places()``; ``async_at`` to them raises
        ``DeadPlaceError``. Does nothing unless overridden."""

    def pre_grow(self, n: int) -> None:
        """Called on a grow order for ``n`` places, before they join the program.
        Does nothing unless overridden."""

    def post_grow(self, n: int, continued: list[Place], added: list[Place]) -> None:
        """Called once every place knows the ``added`` places (new ids, never reused),
        which are now in ``apgas.places()``; ``continued`` are the places there were
        before. Give the new places work here. Not called when the places could
        not start (the order fails and nothing changed). Does nothing unless
        overridden."""

    def on_place_lost(self, places: list[Place]) -> None:
        """Called when ``places`` were lost without an order (an unplanned shrink):
        their process died, or they fell silent (``APGAS_HEARTBEAT``). Does nothing
        unless overridden.

        - It runs at place 0, on a thread of its own (``apgas-place-lost``, not a
          worker), after the runtime has removed ``places`` from ``apgas.places()``
          and failed whatever waited on them (``DeadPlaceError``); it may use every
          APGAS construct.
        - It is called only while this handler is registered, and never for places
          that left by a shrink order or ``release_places``. A place that a shrink
          chose and that dies before it has left is lost: that order ends with an
          error, and this call follows it.
        - Each lost place comes in exactly one call. The places whose loss the
          runtime learnt before the call began (while it waited for an order in
          progress, say) come together; one lost while it runs comes in the next
          call. So several places lost at once may come in one call or several.
        - It is serialized with orders: it holds the lock that grow and shrink
          orders, ``release_places`` and ``disable_malleable_handler`` take, so it
          never runs in the middle of an order (an order that comes meanwhile waits
          for it). So it must not call ``release_places`` or
          ``disable_malleable_handler`` itself (they would wait for it forever);
          start a thread for that.
        - An exception it raises is logged, and the program goes on.

        The scheduler hears of each loss (``APGAS-PlaceLost;<host>``; not the
        ElasticJobScheduler, which does not know that line) before this call, also
        while no handler is registered.
        """


class OrderError(ApgasError):
    """An order that was refused or failed; goes back as ``error <reason>``.

    Nothing was changed, except where the reason says otherwise: a hook of the
    handler that raised after the places changed (``post_grow``,
    ``post_shrink``), or a shrink whose chosen place died before it had left (the
    chosen places that did leave went back, reported as ``Evolving;Release;<host>``)."""


class Orders(Protocol):
    """The runtime's side of the orders: what a communicator calls, as ``self.orders``.

    The runtime gives each communicator one, at place 0. Call its methods from
    a thread of the communicator's own (never from inside :meth:`~MalleableCommunicator.report`,
    :meth:`~MalleableCommunicator.ask` or a ``released`` callback, which may run
    while an order holds the order lock: they would wait for themselves).
    Orders run one at a time: a second ``grow`` or ``shrink`` waits for the
    first, and, in a program that uses ``apgas.steps``, for the step in
    progress to end.
    """

    started_ns: int
    """When ``apgas.run`` started (``time.monotonic_ns()``); the timing lines count from it."""

    def grow(self, n: int, hosts: list[str]) -> list[Place]:
        """Start ``n`` places, one on each of ``hosts`` (a host named twice gets two),
        through the handler (``pre_grow``, the places join, ``post_grow``); return
        the places added, with new ids.

        Blocks until the order is done: the places started (up to
        ``APGAS_JOIN_TIMEOUT`` each) and the handler's hooks returned. Raises
        :class:`OrderError` when the order is refused or fails: no handler is
        registered (or no longer), ``len(hosts) != n``, the program would pass
        ``APGAS_MAX_PLACES``, a place did not start (then none was added), or a
        hook of the handler raised. The timing lines go to
        :meth:`MalleableCommunicator.report` before it returns."""

    def shrink(self, n: int, released: Callable[[list[str]], None]) -> list[str]:
        """Remove ``n`` places chosen by the handler's ``pre_shrink``; return their hosts.

        ``released`` is a callback, not a list: it is called once, with the
        host names of the removed places (a host that had two places comes
        twice), as soon as those places have left, before the handler's
        ``post_shrink`` runs. Send the hosts back to the scheduler there, so that
        it can reuse them at once, however long ``post_shrink`` takes. It runs on
        the thread that called ``shrink``, under the order lock: it must return
        quickly, must not raise, and must not call ``orders``.

        Blocks until ``post_shrink`` returned, then returns the same host names.
        Raises :class:`OrderError` when the order is refused or fails: no handler,
        ``n`` not below the number of places (place 0 always stays), a bad choice
        by ``pre_shrink`` or a hook that raised, or a chosen place that died
        before it had left (then ``released`` is not called, and the hosts of the
        chosen places that did leave come as ``Evolving;Release;<host>`` reports)."""

    def status(self) -> tuple[str, list[Place]]:
        """The program's state (``rigid`` until a handler is registered, ``malleable``,
        ``disabled`` or ``closed``) and its live places, sorted by id."""

    def refused(self, n: int, reason: str) -> None:
        """The scheduler will not grant ``n`` of the places the program asked for
        (``apgas.request_grow``): the newest outstanding requests are refused with
        ``reason`` until ``n`` is covered (:class:`apgas.GrowRefused`)."""

    def order_failed(self, reason: str) -> None:
        """An order the scheduler announced in its answer to a check (``expand k``,
        ``shrink k``) cannot be carried out: a ``check_status`` waiting for it
        returns at once, with the places the program has."""


class MalleableCommunicator(abc.ABC):
    """The seam to a batch scheduler: receives its orders, reports back.

    Subclass it to plug in a scheduler (``docs/communicators.md``). The runtime
    builds one at place 0, when the program registers its handler (or, if
    ``APGAS_COMMUNICATOR``, ``APGAS_SCHEDULER`` or ``APGAS_MALLEABLE_LISTEN`` is
    set, when ``apgas.run`` starts), and calls ``__init__(orders, config)``,
    then :meth:`start`, on that thread, and :meth:`stop` at the end of
    ``apgas.run``, on the thread that runs it. In between it calls
    :meth:`report` and :meth:`ask` from any thread.

    ``__init__(orders, config)`` keeps ``orders`` (the runtime's side, an
    :class:`Orders`) and ``config`` (the program's configuration,
    ``apgas.lowlevel.Config``) as ``self.orders`` and ``self.config``. A
    subclass calls it first, then checks its own settings and raises
    ``ConfigError`` on a bad one (``apgas.run`` or ``define_malleable_handler``
    then fails with it); it starts no thread before :meth:`start`.

    The communicator, on threads of its own, turns each order into a call of
    ``self.orders`` (an :class:`Orders`): ``grow(n, hosts)``,
    ``shrink(n, released)``, ``status()``, ``refused(n, reason)`` or
    ``order_failed(reason)``, and sends the outcome back (the places added, the
    hosts released, or the :class:`OrderError`'s reason). Orders that arrive
    before the handler is registered, or after it is disabled, are refused by
    ``orders`` with an :class:`OrderError`.

    Threading rules: :meth:`report` and :meth:`ask` may be called on any thread,
    several at once, also while an order holds the order lock, so they must
    be thread-safe, return quickly (queue what may block) and never call
    ``orders``. ``orders.grow`` and ``orders.shrink`` block for the whole order.
    """

    def __init__(self, orders: Orders, config: Config) -> None:
        """Keep ``orders`` and ``config`` as ``self.orders`` and ``self.config`` (see the class)."""
        self.orders = orders
        self.config = config

    @abc.abstractmethod
    def start(self) -> None:
        """Begin receiving orders: start the communicator's threads and return.

        Called once, right after ``__init__``. Orders may come at once: the
        ones that come before the handler is registered are refused by
        ``orders`` (the scheduler should wait for the report of
        :data:`apgas.protocol.READY`)."""

    @abc.abstractmethod
    def report(self, message: str) -> None:
        """Send one message to the scheduler, after those reported before it; no
        answer is awaited.

        ``message`` is a line of :mod:`apgas.protocol` (``docs/protocol.md``):
        :data:`~apgas.protocol.READY` (the handler is registered: orders are
        welcome), :data:`~apgas.protocol.NOT_MALLEABLE` (disabled, or the program
        is ending), :func:`~apgas.protocol.timing` lines (``growTimeAPGAS;<n>;<ns>``
        and the like, after each order), :func:`~apgas.protocol.place_lost` (a
        place died without an order), :func:`~apgas.protocol.release` (the
        program released a place itself, or a failed shrink's place did leave)
        and, when :attr:`answers_asks` is false, :func:`~apgas.protocol.request`. A communicator may drop lines its scheduler
        does not know. Called on any thread: see the threading rules above."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop receiving orders and end the communicator's threads.

        Called once, at the end of ``apgas.run`` (also when ``main`` raised),
        after the last order has finished and the last report was made; orders
        that still arrive are refused by ``orders``. Return within a few
        seconds: give pending messages a bounded time to leave, and fail the
        futures of unanswered asks."""

    @property
    def address(self) -> tuple[str, int] | None:
        """Where the communicator listens for orders, as ``(host, port)``, if it
        listens on a socket; None (this default) if it listens nowhere, as the
        ``slurm`` communicator or one that reads a file."""
        return None

    @property
    def attached(self) -> bool:
        """Whether a scheduler is on the other side to hear reports and take asks.
        The evolving calls (``request_grow``, ``release_places``, ``check_status``)
        need one and raise ``ApgasError`` otherwise. False by default."""
        return False

    @property
    def answers_asks(self) -> bool:
        """Whether the scheduler answers asks (True by default). The
        ElasticJobScheduler does not: then ``request_grow`` sends its request
        with :meth:`report` and it stays pending until its grow orders come, and
        ``check_status`` raises ``ApgasError``; :meth:`ask` is not called."""
        return True

    def ask(self, message: str) -> concurrent.futures.Future[str]:
        """Send ``message`` after those reported before it and return at once; the
        future gets the scheduler's one-line answer.

        The runtime asks ``Evolving;Request;<n>`` (``apgas.request_grow``;
        answered ``ok <n>`` or ``error <reason>``, and the places come later with
        grow orders) and ``Evolving;Check;<min>;<max>;<preferred>;<factor>``
        (``apgas.check_status``; answered ``expand <k>``, ``shrink <k>``,
        ``none`` or ``error <reason>``, and the order for ``k`` places follows).
        The future gets an :class:`ApgasError` naming the scheduler when it
        cannot be reached, closes without answering or does not answer in time
        (``check_status`` waits 15 s; a request whose future never ends stays
        pending for good). A future that gets "" counts as no answer too. Set
        its result on any thread, never while holding a lock that ``report``
        takes (its callbacks run on that thread). Called on any thread.

        Raise :class:`ApgasError` at once if nothing can be asked (this default
        does)."""
        raise ApgasError(f"the {type(self).__name__} cannot ask the scheduler anything")


for _public in (MalleableHandler, OrderError, Orders, MalleableCommunicator):
    _public.__module__ = "apgas.malleable"  # their public name (docs, pickles)
