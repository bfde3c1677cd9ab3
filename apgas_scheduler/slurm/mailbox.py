"""The controller's orders and the job's answers, written in Slurm's own job fields.

Orders reach a job under Slurm's authentication and the job opens no port:

- The controller (the Slurm operator, or root) writes an order into the job's
  ``AdminComment``, a field only operators and administrators may set
  (``scontrol update JobId=J AdminComment="apgas-order 3 shrink 2"``), then
  wakes the job with ``scancel --signal=URG --full J``. ``SIGURG`` is ignored
  by default, so the job's shell and steps are not disturbed by it.
- The job (its own user) answers in its ``Comment``, which its user may set:
  ``apgas ready 0`` when it takes orders, ``apgas done 3`` or ``apgas failed 3``
  once order 3 is carried out or failed, ``apgas off`` when it takes none.

A signal only makes the job read its ``AdminComment`` now rather than at its
next poll, so a signal from anybody changes nothing. A user cannot write an
``AdminComment`` (Slurm refuses), so nobody but the operator can order a job;
what a user writes in a ``Comment`` only concerns their own job, and the
controller reads it as untrusted text (bounded, exact grammar).

This module is the one home of both grammars: the controller
(:mod:`apgas_scheduler.slurm.controller`) and the job's communicator
(:mod:`apgas_scheduler.slurm`) build and parse them here.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Order", "Answer", "order_text", "parse_order", "answer_text", "parse_answer",
           "WAKE_SIGNAL", "MAX_TEXT", "VERBS"]

WAKE_SIGNAL = "URG"
"""The signal (``scancel --signal``'s name) that wakes a job to read its orders."""

MAX_TEXT = 200
"""Longer field texts are not ours: they are ignored unread."""

VERBS = ("grow", "shrink")
_ORDER = re.compile(r"apgas-order ([1-9][0-9]{0,8}) (grow|shrink) ([1-9][0-9]{0,5})")
_ANSWER = re.compile(r"apgas (ready|done|failed|off)(?: ([0-9]{1,9}))?")


@dataclasses.dataclass(frozen=True)
class Order:
    """Order ``seq`` of a job: grow or shrink it by ``nodes``."""

    seq: int
    verb: str
    nodes: int


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a job says in its ``Comment``: ``state`` is ``ready``, ``done``,
    ``failed`` or ``off``; ``seq`` the last order it handled (0: none)."""

    state: str
    seq: int

    @property
    def takes_orders(self) -> bool:
        return self.state != "off"


def order_text(order: Order) -> str:
    if order.verb not in VERBS or order.seq < 1 or order.nodes < 1:
        raise ValueError(f"not an order: {order!r}")
    return f"apgas-order {order.seq} {order.verb} {order.nodes}"


def parse_order(text: str | None) -> Order | None:
    """The order in an ``AdminComment``, or None when it holds none (or other text)."""
    if not text or len(text) > MAX_TEXT:
        return None
    found = _ORDER.fullmatch(text.strip())
    if found is None:
        return None
    return Order(int(found.group(1)), found.group(2), int(found.group(3)))


def answer_text(answer: Answer) -> str:
    if answer.state == "off":
        return "apgas off"
    return f"apgas {answer.state} {answer.seq}"


def parse_answer(text: str | None) -> Answer | None:
    """The job's answer in its ``Comment``, or None when it says nothing of ours."""
    if not text or len(text) > MAX_TEXT:
        return None
    found = _ANSWER.fullmatch(text.strip())
    if found is None or (found.group(1) != "off") != (found.group(2) is not None):
        return None
    return Answer(found.group(1), int(found.group(2) or 0))
