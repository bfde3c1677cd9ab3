"""The error a bag gets when it breaks the bag contract (``glb.Bag``).

It lives here, not in :mod:`glb.testing`, because GLB raises it at run time too
(a ``RangeBag`` whose ``work`` returns something without ``fold``), and
:mod:`glb.testing` needs hypothesis, which a run does not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BagContractError", "not_a_result"]


class BagContractError(AssertionError, TypeError):
    """A bag broke a rule of the bag contract; the message names the rule.

    An ``AssertionError`` for :func:`glb.testing.check_bag` (a failed check in a
    test suite) and a ``TypeError`` at run time (a value of the wrong type)."""

    __module__ = "glb"  # tracebacks show where users import it from (and pickles find it)


def not_a_result(bag: Any, method: str, value: Any, expected: Any = None,
                 verb: str = "returned") -> BagContractError:
    """The error for ``bag.<method>`` giving ``value`` where a result (something
    with ``fold``, like ``expected`` if known) belongs."""
    want = "a result with fold(other)"
    if expected is not None:
        want += f", like the {type(expected).__name__} it folds into"
    return BagContractError(f"{type(bag).__name__}.{method} {verb} {type(value).__name__} "
                            f"{_short(value)}, but the bag contract asks for {want}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def submit(bag: Any, result: Any) -> None:
    """``bag.submit(result)``, as GLB calls it when a worker ends (once per worker, not
    per unit): a partial result of the wrong type, met by ``fold``, is named as a
    broken contract, not left as an ``AttributeError`` from inside the fold."""
    try:
        bag.submit(result)
    except AttributeError as e:
        wrong = getattr(e, "obj", None)
        if wrong is None or isinstance(wrong, type(result)) or hasattr(wrong, "fold"):
            raise
        raise BagContractError(
            f"{type(bag).__name__}.submit(result) folded {type(wrong).__name__} "
            f"{_short(wrong)} into the {type(result).__name__} ({e}), but the bag contract "
            "asks for a partial result that is a result, with fold(other)") from e
