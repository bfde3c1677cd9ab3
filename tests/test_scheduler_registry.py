"""The policy registry: built-ins, plug-ins from the entry-point group
``apgas_scheduler.policies`` (a fake distribution on sys.path), and the
errors for a bad entry point."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from conftest import install_distribution

from apgas_scheduler import policies
from apgas_scheduler.policies import registry
from apgas_scheduler.sim.simulator import Simulator

PLUGIN = '''
from apgas_scheduler.policies.classic import FCFS


class Greedy(FCFS):
    """FCFS under another name, with an option of its own."""

    name = "greedy"

    def __init__(self, resize_interval=10.0, label="x"):
        super().__init__(resize_interval)
        self.label = label


NOT_A_POLICY = 42
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A distribution ``fakesched`` registering three entry points."""
    install_distribution(
        tmp_path, "fakesched", "fakesched_policies", PLUGIN,
        "[apgas_scheduler.policies]\n"
        "greedy = fakesched_policies:Greedy\n"
        "broken = fakesched_policies:Missing\n"
        "number = fakesched_policies:NOT_A_POLICY\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("fakesched_policies", None)


@dataclasses.dataclass(frozen=True)
class J:
    id: int
    submit: float
    cls: str = "rigid"
    min_nodes: int = 2
    max_nodes: int = 2
    preferred: int = 2
    runtime: float = 10.0
    estimate: float = 10.0
    rho: float = 0.0
    serial: float | None = None
    name: str = ""


def test_builtins_come_first_and_the_old_names_still_work():
    names = registry.policy_names()
    assert names[:5] == ["fcfs", "backfill", "easy", "malleable", "evolving"]
    assert {"mebf", "dmr"} <= set(names)
    assert policies.get_policy is registry.get_policy
    assert policies.policy_names is registry.policy_names
    with pytest.raises(ValueError, match="unknown policy 'nope'; known: .*fcfs"):
        registry.get_policy("nope")


def test_a_plugin_policy_is_found_and_simulated(plugin):
    assert "greedy" in registry.policy_names()
    policy = registry.get_policy("greedy", label="y")
    assert policy.name == "greedy" and policy.label == "y"
    result = Simulator(4, policy).run([J(1, 0), J(2, 0), J(3, 1)])
    assert {i: (r["start"], r["end"]) for i, r in result.jobs.items()} == \
        {1: (0, 10), 2: (0, 10), 3: (10, 20)}
    assert result.metrics["policy"] == "greedy"


def test_a_bad_entry_point_is_named(plugin):
    with pytest.raises(ValueError, match=r"entry point 'broken' of apgas_scheduler.policies "
                                         r"\(fakesched_policies:Missing\) cannot be loaded: "
                                         r"AttributeError: .*declared by fakesched"):
        registry.get_policy("broken")
    with pytest.raises(ValueError, match=r"entry point 'number' .* must name a Policy"):
        registry.get_policy("number")
