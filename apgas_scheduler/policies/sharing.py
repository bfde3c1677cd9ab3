"""Sharing (``sharing``): lending's successor, first against every published
policy on the archive traces and in ElastiSim (section 9 of the evaluation).

Lending (:mod:`.lending`) lent the idle nodes to one job, and only when the loan
was long and large. On KTH-SP2 and SDSC-BLUE that lost to the Kassel
strategies by 1% to 15%: a malleable job grown from its minimum runs much faster
under Amdahl's law, and the first nodes a job gets are the ones that speed it up
most. Sharing spreads the loans as ``min-common-pool`` does and keeps what
lending added on top:

1. **Promises as in min-common-pool.** Every waiting job that shrinks of the
   running malleable jobs can serve is promised the nodes, taken from the jobs
   with the most nodes above their minimum first, and starts once as many nodes
   are idle.
2. **Thrifty's starts.** A malleable job alone in the queue starts as wide as
   it may; EASY tries the jobs behind the head smallest estimated area first.
3. **Loans to everyone while jobs wait, if they can last.** The idle nodes
   that no waiting job can use without delaying the head go to the running
   resizable jobs, the one holding the fewest above its minimum first, each up
   to its maximum (min's grow). A job gets a loan only if it could keep it for
   ``horizon`` seconds (half an hour): until the head's reservation (EASY's
   shadow time) or its own end, whichever is first. The loans come back by the
   promises of step 1. A loan taken back within minutes costs two resizes for
   little; in ElastiSim it costs more, as a job takes a grow or a shrink only
   at its next scheduling point (the end of an iteration), so lent nodes are
   held until then both ways.
4. **Thrifty's grows when nobody waits.** With an empty queue and no promise,
   idle nodes go to the jobs holding the fewest, and a grow is kept only if it
   shortens the job by at least ``min_gain`` and by ``gamma`` times its cost
   (:func:`.thrifty.paying_grows`): nobody needs the nodes back, so a grow must
   pay for itself.

One pass is lending's (its module docstring gives the pseudo-code) but for the
loans, made while jobs wait::

    for each resizable, unshrunk job j, fewest nodes above its minimum first:
        if min(shadow time of the head, end of j) - now >= horizon:
            grow j by min(idle, its maximum - its size); idle -= that

What it costs: about as many resizes as the Kassel strategies, 0.4 to 4 times
minAgree's on the traces (section 8 of the evaluation gives the exchange rate:
the turnaround each resize beyond minAgree's buys).
"""

from __future__ import annotations

from typing import Literal

from .._model import JobView
from .agreements import AgreementStrategy, Idle
from .lending import Lending
from .planning import Policy
from .thrifty import ReconfigCost

__all__ = ["Sharing", "SHARING_POLICIES"]


class Sharing(Lending):
    """See the module docstring. ``reconfig_cost``, ``gamma``, ``min_gain``,
    ``backfill``, ``start_wide``: as :class:`.thrifty.Thrifty`'s (they rule the
    starts and the grows while nobody waits); ``horizon``: the seconds a loan
    must be able to last (0: every loan, as min-common-pool)."""

    def __init__(self, resize_interval: float = 10.0, *, reconfig_cost: ReconfigCost | None = None,
                 gamma: float = 2.0, min_gain: float | None = None,
                 backfill: Literal["area", "queue"] = "area", start_wide: bool = True,
                 horizon: float = 1800.0) -> None:
        super().__init__(resize_interval, reconfig_cost=reconfig_cost, gamma=gamma,
                         min_gain=min_gain, lend=0.0, backfill=backfill, start_wide=start_wide)
        if not horizon >= 0:
            raise ValueError(f"horizon must be >= 0 seconds, got {horizon}")
        self.name = "sharing"
        self.horizon = horizon

    def __repr__(self) -> str:
        return (f"Sharing(resize_interval={self.resize_interval}, gamma={self.gamma}, "
                f"min_gain={self.min_gain}, horizon={self.horizon})")

    def _loans(self, takers: dict[int, JobView], idle: int, state: Idle) -> dict[int, int]:
        """The loans while jobs wait: to every job that could keep one ``horizon``
        seconds, fewest nodes above its minimum first (lending's grows otherwise)."""
        if self.horizon > 0:  # only the jobs that could keep a loan that long
            now, shadow = state.now, state.shadow(idle)
            takers = {i: j for i, j in takers.items()
                      if min(shadow, j.end_estimate(now)) - now >= self.horizon}
        return AgreementStrategy._grow(self, takers, idle, state)  # min's: fewest first


SHARING_POLICIES: dict[str, type[Policy]] = {"sharing": Sharing}
