"""What GLB runs at each place: the per-place state, the workers, and the
functions other places call (steal, lifeline, deliver, leave).

Work only ever moves inside counted tasks (a worker's ``async_at`` of loot,
or ``_deliver`` itself), so the computation's ``finish`` cannot end while a
bag is on its way. Steal requests and lifeline registrations are short
calls on the victim's immediate pool: they never wait behind busy workers;
but where bags split at once, a worker that runs dry registers with a short
counted task (``_lifeline_call``), which may send loot itself, so a buddy
with an open bag answers at once rather than at the end of its chunk.
A bag that opts in (``concurrent_split``, see ``glb.Bag``) is *open* while its
worker is inside ``process``: a steal request splits it at once, under the
place's lock, instead of waiting for the chunk to end.

Why one module, over the 500-line mark. One module: the workers, the per-place
state and the calls other places make (steal, deliver, arrive, leave) keep one
set of invariants under one lock
(``active``, ``stealing``, ``calls``, ``shared``, ``leaving``); a leave, for
one, is correct only against the exact points where a worker ends. Split, each
half would reach into the other's state.
"""

from __future__ import annotations

import collections
import copy
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import apgas
from apgas.lowlevel import Gate, blocking, immediate_at

from ._config import GLBConfig
from ._contract import submit
from ._lifelines import lifelines
from ._resilience import BAG, COMING, LOOT, STATIC, Held, Ledger, coming, give, open_blob
from ._sampling import Sample, Sampler
from ._stats import PlaceStats

log = logging.getLogger("glb.worker")

_states: dict[int, PlaceState] = {}
_states_lock = threading.Lock()
#: random steals go to this many other places at most, drawn once per membership: links
#: open at their first message, and uniform victims among 1,024 places made almost
#: every pair of places connect (97% of the pairs of 16 places after a UTS run)
STEAL_NEIGHBOURS = 32


def steal_victims(members: list[int], me: int, rng: random.Random) -> list[int]:
    """The places ``me`` steals from at random: every other member, or a random
    :data:`STEAL_NEIGHBOURS` of them."""
    others = [p for p in members if p != me]
    return others if len(others) <= STEAL_NEIGHBOURS else sorted(rng.sample(others, STEAL_NEIGHBOURS))

def state(gid: int) -> PlaceState:
    try:
        return _states[gid]
    except KeyError:
        raise RuntimeError(f"GLB computation {gid} has no state at place {apgas.here().id}") from None


class PlaceState:
    """One place's part of one GLB computation."""

    def __init__(self, gid: int, config: GLBConfig, prototype: Any, members: list[int]) -> None:
        self.gid = gid
        self.config = config
        self.prototype = prototype
        self.me = apgas.here().id
        self.lock = threading.Condition()
        self.result = copy.deepcopy(prototype)
        self.shared: collections.deque[Any] = collections.deque()  # loot (bags) for local and remote thieves
        self.thieves: collections.deque[int] = collections.deque()  # lifeline thieves waiting on us
        self.active = 0          # running worker tasks
        self.stealing = False    # the last worker is out stealing
        self.hungry = False      # a random steal found nothing: keep a piece in `shared`
        self.leaving = False
        self.left = False        # the leave took the result: work arriving now is not done here
        self.calls = 0           # resilient: ends and deliveries on their way to place 0
        self.targets: list[int] = []
        self.asked: set[int] = set()  # lifelines holding our registration, not yet answered
        self.forwarded = 0
        self.warned = False      # a bag broke the split(True) rule: said once
        self.start_ran = False    # the start task ran (a leave waits for it: it may carry work)
        self.members = list(members)
        self.rng = random.Random(config.seed * 7919 + self.me)
        self.victims = steal_victims(self.members, self.me, self.rng)
        self.stats = PlaceStats(place=self.me)
        self.started = time.monotonic()
        # with a timeline only: the load sampler, and the units of running workers by id(result)
        self.sampler: Sampler | None = None
        self.live: dict[int, int] = {}
        # opt-in bags (concurrent_split) whose worker is inside process() now, by id(bag);
        # a steal splits them under self.lock (never in resilient mode: pieces need a ledger)
        self.open: dict[int, Any] = {}
        self.concurrent = not config.keeps_copies
        # checkpoints, at place 0: its workers hold the pause between two safe points, a
        # snapshot passes it as an order; ``slots`` are their bags (glb._checkpoint)
        self.pause = Gate() if config.checkpoint is not None and self.me == 0 else None
        self.slots: dict[int, Slot] = {}
        self.dry_since: float | None = None  # when the place ran out of work (steal latency)

    def sample(self) -> tuple[int, int, int]:
        """Units processed so far (ended and running workers), workers with work, shared pieces."""
        with self.lock:
            return (self.stats.units + sum(self.live.values()),
                    self.active - (1 if self.stealing else 0), len(self.shared))

    # -- membership ---------------------------------------------------------------
    def set_members(self, members: list[int]) -> None:
        """Adopt a new list of live places; an idle place re-sets its lifelines."""
        with self.lock:
            self.members = list(members)
            self.victims = steal_victims(self.members, self.me, self.rng)
            self.thieves = collections.deque(t for t in self.thieves if t in members)
            self.asked.clear()  # a new graph: register afresh
            idle = self.active == 0 and not self.stealing
        if idle:
            self.set_lifelines()

    def set_lifelines(self, in_task: bool = False) -> None:
        """Register on each lifeline that does not hold our registration yet, one way:
        a buddy keeps it until it sends us loot (X10's ``lifelinesActivated``), so an
        idle spell costs no round trips (64 places on 2 cores feel each one).

        ``in_task``: called by a worker task that ran dry. Then (bags split at once
        only) the registration is a counted task, so a buddy whose bag is open answers
        it with a piece at once, where an uncounted call could only note the thief
        for the end of the chunk: one chunk (``n`` units) less per hop of the graph."""
        with self.lock:
            new = [b for b in lifelines(self.config.lifeline, self.members, self.me) if b not in self.asked]
            self.asked.update(new)
            self.stats.lifeline_asked += len(new)
        counted = in_task and self.concurrent
        for buddy in new:
            try:
                if counted:
                    apgas.async_at(buddy, _lifeline_call, self.gid, self.me)
                else:
                    apgas.immediate_async_at(buddy, _register_thief, self.gid, self.me)
            except apgas.DeadPlaceError:
                pass  # gone meanwhile; the next membership change rewires

    # -- handing out work ------------------------------------------------------------
    def share(self, bag: Any, ledger: Ledger | None = None) -> None:
        """After a chunk: split off work if a thief, an idle worker or a hungry peer waits.
        Every waiting lifeline thief gets a piece while the bag splits (X10's ``distribute``):
        one a chunk would keep the last of three buddies waiting three chunks."""
        while True:
            with self.lock:
                remote = bool(self.thieves)
                local = self.active < self.config.workers and not self.shared
                hint = self.hungry and not self.shared
            if not (remote or local or hint) or not bag.is_splittable():
                return
            piece = bag.split(False)
            if piece is None:
                return
            if ledger is not None:
                if not self._share_resilient(bag, piece, ledger, remote):
                    return
                continue
            if remote:
                with self.lock:
                    thief = self.thieves.popleft() if self.thieves else None
                if thief is not None and thief in self.members:
                    try:
                        apgas.async_at(thief, _deliver, self.gid, piece, self.me)
                        with self.lock:
                            self.stats.loot_given += 1
                        continue
                    except apgas.DeadPlaceError:
                        pass
            self._keep(piece)
            return

    def _keep(self, piece: Any) -> None:
        """Put a piece in ``shared`` and start a worker for it if one is missing."""
        with self.lock:
            self.shared.append(piece)
            self.hungry = False
            spawn = self.active < self.config.workers
            if spawn:
                self.active += 1
        if spawn:
            apgas.async_(_worker, self.gid, None)

    def _share_resilient(self, bag: Any, piece: Any, ledger: Ledger, remote: bool) -> bool:
        """The piece is registered at place 0 with the bag's backup, and a lifeline
        thief gets it from there; True if a thief got it."""
        with self.lock:
            thief = self.thieves.popleft() if remote and self.thieves else None
        if thief is not None and thief not in self.members:
            thief = None
        pid, given = ledger.split(bag, piece, thief)
        if given:
            with self.lock:
                self.stats.loot_given += 1
            return True
        self._keep(Held(pid, piece))
        return False

    def split_open(self) -> Any:
        """(Caller holds the lock.) A piece split off an open bag, one whose worker is
        inside ``process`` (opt-in bags only), or None."""
        for bag in self.open.values():
            if bag.is_splittable():
                piece = bag.split(False)
                if piece is not None:
                    self.stats.split_at_once += 1
                    return piece
        return None

    def fed(self) -> None:
        """(Caller holds the lock.) Work reached a place that had run dry: one steal latency."""
        if self.dry_since is not None:
            self.stats.waited += 1
            self.stats.note(self.stats.waits_s, time.monotonic() - self.dry_since, self.stats.waited)
            self.dry_since = None

    def forward(self, bag: Any, ledger: Ledger | None = None, source: Any = None) -> None:
        """A leaving place sends work to a staying one (inside a counted task). Resilient:
        through place 0, ``bag`` registered first if it is a fresh piece of ``source``."""
        with self.lock:
            first = self.forwarded
            self.forwarded += 1
            self.stats.moved_bags += 1
        if not self.config.keeps_copies:
            apgas.async_at(self.targets[first % len(self.targets)], _deliver, self.gid, bag)
            return
        for k in range(len(self.targets)):
            target = self.targets[(first + k) % len(self.targets)]
            if isinstance(bag, Held):
                if give(self.gid, self.me, bag.pid, target):
                    return
            else:
                assert ledger is not None, "a fresh piece comes from a worker's own bag"
                pid, given = ledger.split(source, bag, target)
                if given:
                    return
                bag = Held(pid, bag)
        raise apgas.ApgasError(f"GLB {self.gid}: place {self.me} is leaving, and none of the "
                               f"staying places {self.targets} could take its work")

    def end_worker(self, bag: Any, result: Any, units: int, busy: float,
                   ledger: Ledger | None = None) -> Any:
        """A worker ends (caller holds the lock): submit its bag, the only time it is
        submitted, and keep its result and counts. Resilient: returns what the worker
        must send with ``ledger.end`` once the lock is released."""
        if bag is not None:
            submit(bag, result)  # a partial result of the wrong type is named there
        sealed = None
        if ledger is not None:
            sealed = ledger.ended(result)
            self.calls += 1  # a leave waits until place 0 has the end (see leave)
        self.result.fold(result)
        self.stats.units += units
        self.stats.busy_s += busy
        if self.live:  # sampled (a timeline is written): its units are in stats.units now
            self.live.pop(id(result), None)
        self.active -= 1
        self.lock.notify_all()
        return sealed

    def call_done(self) -> None:
        """A call to place 0 counted in ``calls`` has ended (a leave may be waiting)."""
        with self.lock:
            self.calls -= 1
            self.lock.notify_all()

    # -- stealing -------------------------------------------------------------------------
    def steal(self) -> Any:
        """Up to ``w`` random steal attempts; loot or None."""
        for _ in range(self.config.w):
            victims = self.victims
            if not victims or self.leaving:
                return None
            victim = self.rng.choice(victims)
            sent = time.monotonic()
            try:
                loot = immediate_at(victim, _steal_request, self.gid, self.me)
            except apgas.DeadPlaceError:
                continue
            with self.lock:
                self.stats.random_tried += 1
                self.stats.note(self.stats.steal_rtt_s, time.monotonic() - sent, self.stats.random_tried)
                if loot is not None:
                    self.stats.random_won += 1
            if loot is not None:
                return loot
        return None


def _worker(gid: int, bag: Any, took: int | None = None, key: Any = None) -> None:
    """A worker task: process its bag, share, refill, steal, then end.

    A worker holds one bag for its whole life: loot is merged into it, work
    leaves it only as pieces from ``split``, and it is submitted exactly once,
    when the worker ends (the bag contract in ``glb.Bag``). Resilient, it also
    keeps a :class:`Ledger` with place 0 (``took``: the id of the piece it starts
    with; ``key``: its record's key if place 0 made one for it)."""
    st = state(gid)
    pause = st.pause
    if pause is None:
        _work(st, gid, bag, took, key, None)
        return
    pause.enter()  # checkpoints: from its first step to its end at place 0's store
    slot = Slot()
    with st.lock:
        st.slots[id(slot)] = slot
    try:
        _work(st, gid, bag, took, key, slot)
    finally:
        with st.lock:
            del st.slots[id(slot)]
        pause.exit()


class Slot:
    """A worker's bag and ledger at place 0, for a snapshot (read at a safe point)."""

    __slots__ = ("bag", "ledger")

    def __init__(self) -> None:
        self.bag: Any = None
        self.ledger: Ledger | None = None


def checkpoint_share(gid: int) -> tuple[list[Any], set[int], Any]:
    """Place 0's share of a snapshot, read while its workers stand (glb._checkpoint):
    the bags they hold, the pieces they merged but place 0's store still lists,
    and the place's result."""
    st = state(gid)
    with st.lock:
        slots = list(st.slots.values())
        result = st.result
    bags = [s.bag for s in slots if s.bag is not None]
    merged = {pid for s in slots if s.ledger is not None for pid in s.ledger.merged}
    return bags, merged, result


def _work(st: PlaceState, gid: int, bag: Any, took: int | None, key: Any, slot: Slot | None) -> None:
    """The body of :func:`_worker`; ``slot``: at a checkpointing place 0, where the
    worker shows its bag, and the top of its loop is where it lets a snapshot pass."""
    result = copy.deepcopy(st.prototype)
    n = st.config.n
    units, busy = 0, 0.0
    ledger = (Ledger(gid, st.me, st.config.effective_backup_interval, key)
              if st.config.keeps_copies else None)
    if ledger is not None and took is not None:
        ledger.took(took)
    if slot is not None:
        slot.bag, slot.ledger = bag, ledger
    live = st.live if st.sampler is not None else None  # the timeline's sampler reads it
    if live is not None:
        with st.lock:  # the key is added under the lock, so the sampler's sum sees no resize
            live[id(result)] = 0
    sealed = None
    while True:
        if slot is not None and st.pause is not None and st.pause.wanted():
            st.pause.exit()  # a safe point: the bag and place 0's store agree
            st.pause.enter()
        if bag is not None and not bag.is_empty():
            if st.leaving and _send_away(st, bag, ledger):
                continue
            opened = st.concurrent and _opts_in(bag)
            if opened:
                with st.lock:
                    st.open[id(bag)] = bag
            start = time.perf_counter()
            try:
                done = bag.process(n)
            finally:
                if opened:
                    with st.lock:
                        del st.open[id(bag)]
            end = time.perf_counter()
            busy += end - start
            units += n if done is None else done
            if live is not None:
                live[id(result)] = units
            if ledger is not None:
                ledger.maybe_backup(bag, end, units)
            if not st.leaving:
                st.share(bag, ledger)
            continue
        with st.lock:
            loot = st.shared.popleft() if st.shared else None
            if loot is None and st.open and not st.leaving:
                loot = st.split_open()  # a sibling worker's open bag
            if loot is None:
                if st.active > 1 or st.stealing:  # another worker carries on
                    sealed = st.end_worker(bag, result, units, busy, ledger)
                    break
                st.stealing = True  # the last worker goes stealing
                if st.dry_since is None:
                    st.dry_since = time.monotonic()
        if loot is None:
            loot = None if st.leaving else st.steal()
            with st.lock:
                st.stealing = False
                if (loot is None or coming(loot)) and st.shared:  # a COMING one may be here
                    loot = st.shared.popleft()
                if loot is not None and not coming(loot):
                    st.fed()
                if loot is None or coming(loot):
                    sealed = st.end_worker(bag, result, units, busy, ledger)
                    leaving = st.leaving
            if loot is None:
                if not leaving:
                    st.set_lifelines(in_task=True)
                break
            if coming(loot):  # place 0 sends it in a task that starts a worker
                break
        if st.leaving:
            st.forward(loot)
            continue
        if isinstance(loot, Held):
            assert ledger is not None, "pieces are held in resilient mode only"
            ledger.took(loot.pid)
            loot = loot.bag
        if bag is None:
            bag = loot
            if slot is not None:
                slot.bag = bag
        else:
            bag.merge(loot)
        if ledger is None and st.thieves and not st.leaving:
            st.share(bag)  # lifeline thieves waiting on a dry place: feed them first
    if ledger is not None:
        try:
            ledger.end(sealed)
        finally:
            st.call_done()


def _opts_in(bag: Any) -> bool:
    """Whether ``bag``'s class declares ``concurrent_split = True`` (``glb.Bag``)."""
    return getattr(type(bag), "concurrent_split", False) is True


def _send_away(st: PlaceState, bag: Any, ledger: Ledger | None) -> bool:
    """A leaving place forwards all of ``bag``'s work as ``split(True)``; True if the bag is
    empty now. A bag that breaks the contract (no piece, or work left behind) is processed
    here instead, so nothing is lost: the place just leaves later."""
    piece = bag.split(True)
    if piece is not None:
        st.forward(piece, ledger, bag)
    if bag.is_empty():
        return True
    if not st.warned:
        st.warned = True
        log.warning("%s.split(True) %s; the leaving place %d processes the rest itself "
                    "(see the bag contract in glb.Bag)", type(bag).__name__,
                    "returned None" if piece is None else "left work in the bag", st.me)
    return False


# -- called by other places -------------------------------------------------------------
def _steal_request(gid: int, thief: int) -> Any:
    """Immediate: hand over a piece of shared work, or note that someone is hungry.
    Resilient: place 0 sends the piece to the thief, and the answer is ``COMING``."""
    st = _states.get(gid)
    if st is None:
        return None
    with st.lock:
        if st.leaving:
            return None
        loot = st.shared.popleft() if st.shared else st.split_open()
        if loot is None:
            if st.active:
                st.hungry = True
            return None
        st.stats.loot_given += 1
    if not isinstance(loot, Held):
        return loot
    if give(gid, st.me, loot.pid, thief):
        return COMING
    # The thief is gone. This call counts for no finish, so it cannot start a worker
    # here: place 0 sends the piece back in a counted task (or, if the computation's
    # finish has ended meanwhile, keeps it for the next round).
    with st.lock:
        st.stats.loot_given -= 1
    give(gid, st.me, loot.pid, st.me)
    return None


def _register_thief(gid: int, thief: int) -> None:
    """Immediate: ``thief`` waits on us; a worker sends it loot when it can."""
    st = _states.get(gid)
    if st is None:
        return
    with st.lock:
        if not st.leaving and thief not in st.thieves and thief != st.me:
            st.thieves.append(thief)


def _lifeline_call(gid: int, thief: int) -> None:
    """Counted: ``thief`` sets its lifeline on us; an open bag gives it a piece at
    once (sent from this counted task), else it waits like any registered thief."""
    st = _states.get(gid)
    if st is None:
        return
    with st.lock:
        if st.leaving or thief == st.me or thief in st.thieves:
            return
        loot = st.split_open() if st.concurrent and thief in st.members else None
        if loot is None:
            st.thieves.append(thief)
            return
        st.stats.loot_given += 1
    try:
        apgas.async_at(thief, _deliver, gid, loot, st.me)
    except apgas.DeadPlaceError:
        st._keep(loot)  # the thief is gone: the work stays here


def _deliver(gid: int, loot: Any, buddy: int | None = None) -> None:
    """Counted: loot arrives (from lifeline ``buddy``, or moved from a leaving place)."""
    st = state(gid)
    if buddy is not None:
        with st.lock:
            st.asked.discard(buddy)  # it answered: register there again when idle
    if st.leaving:
        st.forward(loot)
        return
    with st.lock:
        st.shared.append(loot)
        st.stats.lifeline_won += 1
        st.fed()
        start = st.active < st.config.workers
        if start:
            st.active += 1
    if start:
        _worker(gid, None)


def arrive(gid: int, pid: int, kind: str, bag: Any, giver: int | None) -> None:
    """Counted, resilient: a piece sent by place 0 arrives, given by ``giver`` (None:
    restored). Loot joins ``shared``; a dead place's restored bag (it may hold a partial
    result) gets a worker of its own."""
    st = state(gid)
    with st.lock:
        if st.left:  # place 0 takes the piece back when it retires this place
            log.debug("GLB %d: piece %d reached place %d after it left; dropped", gid, pid, st.me)
            return
        if kind != LOOT:
            st.active += 1
            st.fed()
        else:
            st.calls += 1  # a leaving place forwards it through place 0
    bag = open_blob(bag)
    if kind == LOOT:
        try:
            _deliver(gid, Held(pid, bag), giver)
        finally:
            st.call_done()
        return
    assert kind in (BAG, STATIC), kind
    if kind == STATIC:
        bag = bag.make_bag(bag.index, bag.count)
    _worker(gid, bag, took=pid)


def init_place(gid: int, config: GLBConfig, prototype: Any, members: list[int],
               join: bool = False, sample: float | None = None) -> None:
    """Create this place's state; a place joining a running computation sets lifelines.
    With ``sample`` (place 0 writes a timeline), sample the load every ``sample`` seconds."""
    with _states_lock:
        if gid not in _states:
            st = _states[gid] = PlaceState(gid, config, prototype, members)
            if sample is not None:
                st.sampler = Sampler(sample, st.sample, f"glb-sampler-{gid}").start()
    if join:
        _states[gid].set_lifelines()


def start_dynamic(gid: int, bag: Any) -> None:
    st = state(gid)
    with st.lock:
        st.active += 1
        st.start_ran = True
    _worker(gid, bag)


def start_static(gid: int, make_bag: Callable[[int, int], Any], position: int, places: int) -> None:
    st = state(gid)
    workers = st.config.workers
    with st.lock:
        st.active += workers
        st.start_ran = True
    def key(index: int) -> Any:  # resilient: the record place 0 made for this worker
        return (st.me, ("static", index)) if st.config.keeps_copies else None
    for k in range(1, workers):
        index = position * workers + k
        apgas.async_(_worker, gid, make_bag(index, places * workers), None, key(index))
    index = position * workers
    _worker(gid, make_bag(index, places * workers), None, key(index))


def members(gid: int) -> list[int] | None:
    """This place's list of the computation's live places (None: no such computation)."""
    st = _states.get(gid)
    return None if st is None else list(st.members)


def set_members(gid: int, members: list[int]) -> None:
    st = _states.get(gid)
    if st is not None:
        st.set_members(members)


def leave(gid: int, targets: list[int], start_coming: bool = False
          ) -> tuple[Any, list[int], PlaceStats, list[Sample] | None]:
    """Immediate, at a leaving place: send all work to ``targets``, wait for the
    workers to end, and return the partial result, the waiting thieves, the stats
    and the load samples (None without a timeline).

    With ``start_coming`` (the place's start task was sent), also wait for that task
    to have run: as an immediate call, the leave may overtake it, and the work it
    brings (a static share) must leave too, not be done after the result was taken.
    Resilient, also wait until place 0 has every worker's end (else place 0 could
    restore a record whose result is in this answer); work that arrives after the
    answer is dropped here, and place 0 sends it elsewhere when it retires the place."""
    st = state(gid)
    with st.lock:
        st.leaving = True
        st.targets = list(targets)
        thieves = list(st.thieves)
        st.thieves.clear()
    with blocking(), st.lock:
        st.lock.wait_for(lambda: (st.start_ran or not start_coming) and st.active == 0
                         and not st.stealing and st.calls == 0)
        result, st.result = st.result, copy.deepcopy(st.prototype)
        st.left = True
    st.stats.moved_results += 1
    return result, thieves, collect_stats(st), _samples(st)


def register_thieves(gid: int, thieves: list[int]) -> None:
    for t in thieves:
        _register_thief(gid, t)


def absorb(gid: int, result: Any) -> None:
    """Fold a partial result moved from a leaving place."""
    st = state(gid)
    with st.lock:
        st.result.fold(result)


def load(gid: int) -> float:
    """Immediate: the share of this place's workers that hold work now."""
    st = _states.get(gid)
    if st is None:
        return 0.0
    with st.lock:
        working = st.active - (1 if st.stealing else 0)
    return max(0.0, min(1.0, working / st.config.workers))


def collect_stats(st: PlaceState) -> PlaceStats:
    stats = copy.copy(st.stats)
    stats.idle_s = max(0.0, st.config.workers * (time.monotonic() - st.started) - stats.busy_s)
    return stats


def collect(gid: int) -> tuple[Any, PlaceStats, list[Sample] | None]:
    """End of the computation: this place's result, stats and load samples (None
    without a timeline); forget the state."""
    with _states_lock:
        st = _states.pop(gid)
    return st.result, collect_stats(st), _samples(st)


def forget(gid: int) -> None:
    """After a failed computation: drop this place's state (if any) and stop its sampler."""
    with _states_lock:
        st = _states.pop(gid, None)
    if st is not None:
        _samples(st)


def _samples(st: PlaceState) -> list[Sample] | None:
    """Stop sampling: the samples, the last one taken now (None if not sampling)."""
    sampler, st.sampler = st.sampler, None
    return None if sampler is None else sampler.stop()
