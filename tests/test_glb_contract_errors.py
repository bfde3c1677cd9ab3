"""A bag whose work returns the wrong type (issue 42, item 4): ``check_bag`` and a
real run both name the bag, the method and what it returned, as a
``BagContractError`` (an ``AssertionError`` for test suites, a ``TypeError`` at run
time), not an ``AttributeError`` from inside GLB."""

from __future__ import annotations

from typing import Any

import pytest

import apgas
import glb
from glb import GLB, GLBConfig
from glb.bags import RangeBag
from glb.testing import check_bag


class Sum:
    """A result, as docs/glb.md writes one for RangeBag."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def fold(self, other: Sum) -> None:
        self.value += other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sum) and other.value == self.value


class Squares(RangeBag):
    """The mistake: ``work`` returns the plain number, not a ``Sum``."""

    def work(self, lo: int, hi: int) -> Any:
        return sum(i * i for i in range(lo, hi))


class GoodSquares(RangeBag):
    def work(self, lo: int, hi: int) -> Any:
        return Sum(sum(i * i for i in range(lo, hi)))


class SometimesInt(RangeBag):
    """Right for the first block of each piece, wrong afterwards."""

    def work(self, lo: int, hi: int) -> Any:
        total = sum(i * i for i in range(lo, hi))
        return Sum(total) if self.partial is None else total


def test_error_is_both_an_assertion_and_a_type_error() -> None:
    assert issubclass(glb.BagContractError, AssertionError)
    assert issubclass(glb.BagContractError, TypeError)
    from glb.testing import BagContractError
    assert BagContractError is glb.BagContractError


def test_check_bag_names_the_bag_the_method_and_the_type() -> None:
    with pytest.raises(glb.BagContractError) as info:
        check_bag(lambda: Squares(0, 100), Sum)
    message = str(info.value)
    assert message.startswith("Squares.work(lo, hi) returned int ")
    assert "the bag contract asks for a result with fold(other)" in message


def test_check_bag_names_a_wrong_value_after_a_right_one() -> None:
    with pytest.raises(glb.BagContractError, match=r"SometimesInt\.work\(lo, hi\) returned int .*"
                       r"a result with fold\(other\), like the Sum it folds into"):
        check_bag(lambda: SometimesInt(0, 100), Sum)


def test_check_bag_names_a_result_without_fold() -> None:
    with pytest.raises(glb.BagContractError, match=r"make_result\(\) returned int 0, but the "
                       r"bag contract asks for a result with fold\(other\)"):
        check_bag(lambda: GoodSquares(0, 100), int)


def test_check_bag_names_the_method_of_any_bag() -> None:
    class Counter:
        """Not a RangeBag: its partial result is a plain int, which submit folds."""

        def __init__(self, n: int = 20) -> None:
            self.n, self.done = n, 0

        def process(self, k: int) -> int:
            d = min(k, self.n)
            self.n -= d
            self.done += d
            return d

        def is_empty(self) -> bool:
            return self.n == 0

        def is_splittable(self) -> bool:
            return False

        def split(self, take_all: bool) -> Any:
            return None

        def merge(self, other: Any) -> None:
            pass

        def submit(self, result: Any) -> None:
            result.fold(self.done)

    with pytest.raises(glb.BagContractError, match=r"Counter\.submit\(\.\.\.\) met int 20, but "
                       r"the bag contract asks for a result with fold\(other\), like the Sum"):
        check_bag(Counter, Sum)


def test_a_right_range_bag_passes() -> None:
    check_bag(lambda: GoodSquares(0, 60), Sum, expected=Sum(sum(i * i for i in range(60))))


@pytest.mark.timeout(60)
def test_a_run_names_the_bag_and_the_type() -> None:
    def main() -> str:
        try:
            GLB(GLBConfig(n=8, workers=1)).compute_dynamic(Squares(0, 20_000), Sum())
        except Exception as e:  # noqa: BLE001 - what the user sees is the point
            return _messages(e)
        return "no error"

    seen = apgas.run(main, places=2, threads=2)
    assert "BagContractError" in seen, seen
    assert "Squares.work(lo, hi) returned int" in seen, seen
    assert "has no attribute 'fold'" not in seen.split("BagContractError", 1)[1], seen


def _messages(e: BaseException) -> str:
    """The exception and every exception inside it, as ``Type: message`` lines."""
    inner = getattr(e, "exceptions", None) or []
    cause = [e.__cause__] if e.__cause__ is not None and not inner else []
    return "\n".join([f"{type(e).__name__}: {e}", *(_messages(x) for x in [*inner, *cause])])
