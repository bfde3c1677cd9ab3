"""Check a bag against the bag contract (``glb.Bag``) in your own test suite.

    from glb.testing import check_bag

    def test_my_bag_keeps_the_contract():
        check_bag(lambda: MyBag(size=200), MyResult)

:func:`check_bag` uses hypothesis to drive random sequences of the calls GLB
makes (``process``, ``split(False)``, ``split(True)``, ``merge`` of a fresh
piece, pickle round trips as when work travels, ``submit`` of an empty bag)
and checks after every call that nothing was lost or counted twice: the
results submitted so far, folded with what the live bags still give when
drained, must equal a plain sequential run of ``make_bag()``. Every submit
is also tried on a copy of the bag with a result that already holds the whole
sequential run, as when other bags were submitted first: ``submit`` must fold
into that, not overwrite it, and every example ends with a submit, so this rule
is checked whatever the schedule. The first call that breaks a rule raises
:class:`BagContractError` naming the rule and the calls that led there
(hypothesis shrinks them to a short sequence first).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle

from ._contract import BagContractError, not_a_result

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("glb.testing needs hypothesis: pip install 'apgas[testing]' "
                      "(or pip install hypothesis)") from e

__all__ = ["BagContractError", "check_bag"]

_STALL_LIMIT = 10_000  # process() calls in a row that do nothing on a bag that is not empty


def check_bag(make_bag: Callable[[], Any], make_result: Callable[[], Any], *,
              expected: Any = None, same: Callable[[Any, Any], bool] | None = None,
              max_examples: int = 100, max_calls: int = 25, max_n: int = 8) -> None:
    """Check the bags ``make_bag()`` returns against the bag contract; raise
    :class:`BagContractError` with the first broken rule.

    ``make_bag()`` returns a fresh bag with all of some work; keep it small (up
    to a few hundred units), since every step drains copies of the live bags.
    ``make_result()`` returns the neutral result. ``expected``, when given, is
    the right result of all the work: the sequential run must give it too (else
    a rule of ``process`` or ``submit`` is broken even without splitting); the
    checks compare with the sequential run. ``same(a, b)`` says whether
    two results are equal: by default ``a == b`` when the result class defines
    ``__eq__``, else their attributes are compared (give ``same`` for results
    of floating-point sums, whose value depends on the order of folds).
    ``process`` is called with ``n`` from 1 to ``max_n``; each example makes up
    to ``max_calls`` calls before the live bags are drained.
    """
    equal = same or _same_by_value
    neutral = make_result()
    if not hasattr(neutral, "fold"):
        raise BagContractError(f"make_result() returned {type(neutral).__name__} {neutral!r}, "
                               "but the bag contract asks for a result with fold(other)")
    bag = make_bag()
    try:
        cloudpickle.dumps(bag)
    except Exception as e:
        raise BagContractError(f"the bag does not pickle (bags travel between places): {e!r}") from e
    try:
        _check(make_bag, make_result, equal, expected, max_examples, max_calls, max_n)
    except AttributeError as e:  # a value without fold where a result belongs, met by the bag
        wrong = getattr(e, "obj", None)
        if wrong is None or hasattr(wrong, "fold"):
            raise
        raise not_a_result(bag, _method(e, type(bag)), wrong, neutral, verb="met") from e


def _check(make_bag: Callable[[], Any], make_result: Callable[[], Any],
           equal: Callable[[Any, Any], bool], expected: Any, max_examples: int, max_calls: int,
           max_n: int) -> None:
    sequential = _drain(make_bag(), make_result(), "the sequential run")
    if expected is not None and not equal(sequential, expected):
        raise BagContractError(f"the sequential run (process until empty, then submit once) gives "
                               f"{sequential!r}, not the expected {expected!r}: process or "
                               "submit is wrong even without splitting")

    @settings(max_examples=max_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        _Run(make_bag, make_result, equal, sequential, max_n).play(data, max_calls)

    run()


class _Run:
    """One example: live bags, the result submitted so far, and the calls made."""

    def __init__(self, make_bag: Callable[[], Any], make_result: Callable[[], Any],
                 equal: Callable[[Any, Any], bool], expected: Any, max_n: int) -> None:
        self.make_result = make_result
        self.equal = equal
        self.expected = expected
        self.max_n = max_n
        self.bags: list[Any] = [make_bag()]
        self.fresh: list[bool] = [False]  # a piece nothing has processed since split made it
        self.submitted = make_result()
        self.calls: list[str] = []

    def play(self, data: st.DataObject, max_calls: int) -> None:
        for _ in range(data.draw(st.integers(0, max_calls), label="calls")):
            if not self.bags:
                break
            i = data.draw(st.integers(0, len(self.bags) - 1), label="bag")
            kind = data.draw(st.sampled_from(["process", "split", "split_all", "merge", "pickle",
                                              "submit"]), label="call")
            getattr(self, kind)(i, data)
        while self.bags:  # the workers end: each drains its bag and submits it
            self.calls.append("bag0 drained")
            _drain(self.bags[0], None, "a bag")
            self.check("process(n) lost work or did it twice")
            self.fresh[0] = False
            self.submit(0, data)
        if not self.equal(self.submitted, self.expected):
            self.fail("the folded result differs from the sequential run: "
                      f"{self.submitted!r} != {self.expected!r}")

    # -- the calls GLB makes ------------------------------------------------------------
    def process(self, i: int, data: st.DataObject) -> None:
        bag = self.bags[i]
        if bag.is_empty():
            return
        n = data.draw(st.integers(1, self.max_n), label="n")
        self.calls.append(f"bag{i}.process({n})")
        done = bag.process(n)
        if done is not None and (not isinstance(done, int) or done < 0):
            self.fail(f"process({n}) returned {done!r}: it must return the count of units it "
                      f"did, an integer >= 0 (or None for {n})")
        self.fresh[i] = False
        self.check(f"process({n}) lost work or did it twice")

    def split(self, i: int, data: st.DataObject, take_all: bool = False) -> None:
        bag = self.bags[i]
        if bag.is_empty() if take_all else not bag.is_splittable():
            return  # GLB calls split(True) on bags with work, split(False) on splittable ones
        self.calls.append(f"bag{i}.split({take_all})")
        piece = bag.split(take_all)
        if piece is bag:
            self.fail(f"split({take_all}) returned the bag itself, not a new bag")
        if take_all and piece is None:
            self.fail("split(True) returned None from a bag that is not empty: a leaving place "
                      "could not give its work away")
        if take_all and not bag.is_empty():
            self.fail(f"split(True) left work in the bag: is_empty() is False afterwards ({bag!r})")
        if piece is not None:
            self.bags.append(piece)
            self.fresh.append(True)
            self.calls[-1] += f" -> bag{len(self.bags) - 1}"
        self.check(f"split({take_all}) copied or lost work or partial result (it must move "
                   "them into the piece)")

    def split_all(self, i: int, data: st.DataObject) -> None:
        self.split(i, data, take_all=True)

    def merge(self, i: int, data: st.DataObject) -> None:
        pieces = [j for j, fresh in enumerate(self.fresh) if fresh and j != i]
        if not pieces:
            return
        j = data.draw(st.sampled_from(pieces), label="piece")
        self.calls.append(f"bag{i}.merge(bag{j})")
        self.bags[i].merge(self.bags[j])
        del self.bags[j], self.fresh[j]
        self.check("merge(other) lost or duplicated the other bag's work or partial result")

    def pickle(self, i: int, data: st.DataObject) -> None:
        self.calls.append(f"bag{i} = loads(dumps(bag{i}))")
        try:
            self.bags[i] = cloudpickle.loads(cloudpickle.dumps(self.bags[i]))
        except Exception as e:
            self.fail(f"the bag does not pickle (bags travel between places): {e!r}")
        self.check("the result differs after a pickle round trip")

    def submit(self, i: int, data: st.DataObject) -> None:
        bag = self.bags[i]
        if not bag.is_empty():
            return  # GLB submits a bag when the worker holding it ends: it is empty then
        self.calls.append(f"bag{i}.submit(result)")
        self.check_submit_folds(bag)
        bag.submit(self.submitted)
        del self.bags[i], self.fresh[i]
        self.check("submit(result) did not fold the bag's partial result exactly once")

    def check_submit_folds(self, bag: Any) -> None:
        """``submit`` folds into a result that others have submitted into already.

        The results submitted in an example may still be neutral when a bag is
        submitted (the first bag, or bags that did no work before), and then a submit
        that overwrites the result passes for one that folds. So a copy of the bag is
        also submitted into a result holding the whole sequential run, and that must
        give the sequential run folded with the bag's partial result alone.
        """
        alone = self.make_result()
        _copy_state(bag).submit(alone)
        into = copy.deepcopy(self.expected)
        _copy_state(bag).submit(into)
        want = copy.deepcopy(self.expected)
        want.fold(alone)
        if not self.equal(into, want):
            self.fail("submit(result) did not fold the bag's partial result exactly once: "
                      f"submitted into a result holding {self.expected!r} (as if other bags "
                      f"were submitted first) it gives {into!r}, not {want!r} (the bag's "
                      f"partial result alone is {alone!r})")

    # -----------------------------------------------------------------------------------
    def check(self, rule: str) -> None:
        """Everything submitted, with what the live bags still give, is the whole result."""
        total = copy.deepcopy(self.submitted)
        for bag in self.bags:
            total.fold(_drain(_copy_state(bag), self.make_result(), "a copy of a bag"))
        if not self.equal(total, self.expected):
            self.fail(f"{rule}: the bags and the submitted results now give {total!r}, "
                      f"the sequential run {self.expected!r}")

    def fail(self, message: str) -> None:
        raise BagContractError(f"{message}\n  after: {'; '.join(self.calls) or 'no call'}")


_LOCKS: dict[type, Any] = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}


def _copy_state(bag: Any) -> Any:
    """A deep copy of ``bag`` that bypasses its own pickling methods (``__getstate__``,
    ``__reduce__``), so that the pickle round trip is checked only where GLB makes one."""
    if not hasattr(bag, "__dict__") and not getattr(type(bag), "__slots__", None):
        return copy.deepcopy(bag)
    twin = object.__new__(type(bag))
    memo: dict[int, Any] = {id(bag): twin}
    for name, value in getattr(bag, "__dict__", {}).items():
        # a bag that opts in to concurrent_split holds a lock of its own: the copy gets a new one
        fresh = _LOCKS.get(type(value))
        object.__setattr__(twin, name, fresh() if fresh is not None else copy.deepcopy(value, memo))
    for klass in type(bag).__mro__:
        for name in (klass.__dict__.get("__slots__", ()) if isinstance(klass.__dict__.get("__slots__", ()), tuple) else ()):
            if name not in ("__dict__", "__weakref__") and hasattr(bag, name):
                object.__setattr__(twin, name, copy.deepcopy(getattr(bag, name), memo))
    return twin


def _drain(bag: Any, result: Any, what: str) -> Any:
    """Process ``bag`` until it is empty, submit it into ``result`` (unless None); return ``result``."""
    stalls = 0
    while not bag.is_empty():
        done = bag.process(1 << 30)
        stalls = stalls + 1 if done == 0 else 0
        if stalls >= _STALL_LIMIT:
            raise BagContractError(f"process(n) did nothing {_STALL_LIMIT} times in a row while "
                                   f"draining {what}, which is not empty: {bag!r}")
    if result is not None:
        bag.submit(result)
    return result


def _method(e: BaseException, bag_class: type) -> str:
    """The last method of a ``bag_class`` bag in ``e``'s traceback (where the bag met
    the wrong value), as ``name(...)``."""
    name = "a method"
    tb = e.__traceback__
    while tb is not None:
        if isinstance(tb.tb_frame.f_locals.get("self"), bag_class):
            name = tb.tb_frame.f_code.co_name + "(...)"
        tb = tb.tb_next
    return name


def _same_by_value(a: Any, b: Any) -> bool:
    eq: object = type(a).__eq__  # object: mypy sees no overlap of the two signatures
    if eq is not object.__eq__:
        return bool(a == b)
    return type(a) is type(b) and _state(a) == _state(b)


def _state(obj: Any) -> Any:
    if hasattr(obj, "__dict__"):
        return vars(obj)
    return tuple(getattr(obj, name, None) for name in getattr(type(obj), "__slots__", ()))
