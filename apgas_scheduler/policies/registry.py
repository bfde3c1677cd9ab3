"""Policies by name: the built-ins, then those other distributions register
under the entry-point group ``apgas_scheduler.policies`` (as ``launcher`` finds
launchers under ``apgas.launchers``). An entry point names a :class:`Policy`
subclass (or any callable returning a ``Policy``), built with the options of
:func:`get_policy`; a plug-in cannot replace a built-in.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from launcher._entry_points import load_entry_point

from .agreements import AGREEMENT_POLICIES
from .classic import POLICIES
from .dmr import DMR_POLICIES
from .lending import LENDING_POLICIES
from .mebf import MEBF_POLICIES
from .planning import Policy
from .sharing import SHARING_POLICIES
from .thrifty import THRIFTY_POLICIES

__all__ = ["get_policy", "policy_names", "GROUP"]

GROUP = "apgas_scheduler.policies"

_BUILTIN: dict[str, Callable[..., Policy]] = {**POLICIES, **MEBF_POLICIES, **DMR_POLICIES,
                                              **AGREEMENT_POLICIES, **THRIFTY_POLICIES,
                                              **LENDING_POLICIES, **SHARING_POLICIES}
"""The live policies, then those from the later studies (MEBF, DMR, the Kassel
group's nine), then our own."""


def policy_names() -> list[str]:
    """Every policy name: the built-ins, then the installed plugins."""
    return list(_BUILTIN) + sorted({ep.name for ep in entry_points(group=GROUP)
                                    if ep.name not in _BUILTIN})


def get_policy(name: str, **options: Any) -> Policy:
    """The policy called ``name``, built with ``options``; ``ValueError`` names
    the known ones, or the entry point that does not give a policy."""
    factory = _BUILTIN.get(name)
    if factory is None:
        found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
        if not found:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(policy_names()))}")
        ep = found[0]
        factory = load_entry_point(ep)
        if not callable(factory):
            raise ValueError(f"entry point {name!r} of {GROUP} ({ep.value}) must name a Policy "
                             f"subclass, got {factory!r}")
    policy = factory(**options)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {name!r} ({GROUP}) must build a Policy, got {policy!r}")
    return policy
