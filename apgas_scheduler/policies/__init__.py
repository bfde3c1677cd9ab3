"""Scheduling policies: pure functions from a snapshot of the cluster to a
list of decisions, shared by the live scheduler and the simulator through
the engine (:mod:`apgas_scheduler.engine`).

This module is the policies' public face: the ``Policy`` base class and its
helpers (:mod:`.planning`), the built-in policies (:mod:`.classic`: FCFS,
Backfilling, EASY, minAgree, evolving EASY; :mod:`.mebf`; :mod:`.dmr`) and the
registry that finds them and plug-ins by name (:mod:`.registry`).
"""

from __future__ import annotations

from .classic import FCFS, POLICIES, Backfilling, EasyBackfilling, EvolvingEasy, MinAgree
from .planning import GATE, Policy, easy, grant_requests, min_agree_size, moldable_size, with_grants
from .registry import GROUP, get_policy, policy_names

__all__ = [
    "Policy", "FCFS", "Backfilling", "EasyBackfilling", "MinAgree", "EvolvingEasy",
    "POLICIES", "get_policy", "policy_names", "GROUP", "easy", "moldable_size",
    "min_agree_size", "grant_requests", "with_grants", "GATE",
]
