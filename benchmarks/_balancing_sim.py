"""GLB's own figures for ``benchmarks.balancing``: its steals, their latency and the places'
idle time from ``glb.stats()``, beside a discrete-event model of GLB on the same tree.

The same tree, the same bags and splits as ``glb.apps.synthetic`` (the real
:class:`~glb.apps.synthetic.SyntheticBag`, with no sleeping), one worker a
place, GLB's protocol: a place that runs dry makes ``w`` random steal
attempts, then registers on its lifelines (a binary tree, or a hypercube,
over the places, as ``glb._lifelines``), once until a lifeline answers; a
busy place gives every waiting lifeline thief a piece at the end of each
chunk of ``n`` units. Each message takes ``latency`` seconds one way and
costs no CPU; a unit takes ``unit`` seconds.

``eager`` (GLB's protocol since issue 44): a registration that reaches a place
whose bag can split is answered with a piece at once (with ``at_once``), and a
place that gets loot first gives every waiting lifeline thief a piece; without
it, lifeline thieves are served at chunk ends only, so work crossed the graph
one chunk per hop (the model at 64 places, ``w`` 1, binary lifelines, instant
steals, means of 6 seeds: 0.87 without, 0.88 with at ``n`` 8; 0.66 and 0.84 at ``n`` 32).

``at_once``: a random steal is answered when it arrives, by a split of the
victim's bag (GLB with a ``concurrent_split`` bag); otherwise at the end of the
victim's chunk (the victim answers between two ``process`` calls). With
``latency=0`` and ``at_once`` the model is GLB with instant steals: what is
left is the tree's shape and the split rule. ``static``: each place starts
with its static piece (``synthetic.make_static_bag``), as ``--static`` does.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

from glb._lifelines import lifelines

__all__ = ["simulate", "glb_figures", "render_glb"]

_CHUNK, _ASK, _REPLY, _REGISTER, _LOOT = range(5)


class _Place:
    __slots__ = ("bag", "stealing", "tries", "asked", "thieves", "requests", "pending")

    def __init__(self) -> None:
        self.bag: Any = None              # the bag while working
        self.stealing = False             # a random steal is on its way
        self.tries = 0                    # random attempts left
        self.asked: set[int] = set()      # lifelines holding our registration
        self.thieves: list[int] = []      # lifeline thieves waiting on us
        self.requests: list[int] = []     # random thieves waiting for our chunk to end
        self.pending: list[Any] = []      # loot that came while a random steal was out


def simulate(params: dict, places: int, *, n: int = 8, w: int = 1, lifeline: str = "binary",
             latency: float = 0.0, at_once: bool = True, static: bool = False,
             seed: int = 0, eager: bool = True) -> dict[str, Any]:
    """GLB's run on ``params``'s tree over ``places`` places; efficiency, end time, steals."""
    from glb.apps import synthetic
    unit = synthetic.unit_seconds(params)
    rng = random.Random(seed)
    ps = [_Place() for _ in range(places)]
    members = list(range(places))
    events: list[tuple[float, int, int, int, Any]] = []
    seq = 0
    counts = {"units": 0, "random_tried": 0, "random_won": 0, "lifeline_won": 0}

    def at(t: float, kind: int, where: int, data: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, where, data))

    def work(t: float, i: int) -> None:   # place i takes its next chunk
        done = ps[i].bag.process(n)
        counts["units"] += done
        at(t + done * unit, _CHUNK, i)

    def dry(t: float, i: int) -> None:   # place i has no work: random steals, then lifelines
        p = ps[i]
        p.bag = None
        if p.pending:
            take(t, i, p.pending.pop())
            return
        p.tries = w
        ask(t, i)

    def ask(t: float, i: int) -> None:
        p = ps[i]
        if p.tries > 0 and places > 1:
            p.tries -= 1
            p.stealing = True
            counts["random_tried"] += 1
            victim = rng.choice([v for v in members if v != i])
            at(t + latency, _ASK, victim, i)
            return
        for b in lifelines(lifeline, members, i):
            if b not in p.asked:
                p.asked.add(b)
                at(t + latency, _REGISTER, b, i)

    def take(t: float, i: int, loot: Any) -> None:
        p = ps[i]
        for more in p.pending:
            loot.merge(more)
        p.pending.clear()
        p.bag = loot
        if eager:
            feed(t, i)
        work(t, i)

    def feed(t: float, i: int) -> None:   # every waiting lifeline thief gets a piece
        p = ps[i]
        while p.thieves and (loot := piece(i)) is not None:
            at(t + latency, _LOOT, p.thieves.pop(0), (i, loot))

    def piece(i: int) -> Any:
        bag = ps[i].bag
        return bag.split(False) if bag is not None and bag.is_splittable() else None

    end = 0.0
    free = {**params, "unit_ms": 0.0}
    for i in range(places):
        if static or i == 0:
            ps[i].bag = synthetic.make_static_bag(free, i, places) if static else synthetic.make_bag(free)
            work(0.0, i)
        else:
            dry(0.0, i)
    while events:
        t, _, kind, i, data = heapq.heappop(events)
        p = ps[i]
        if kind == _CHUNK:
            end = t
            for thief in p.requests:    # random thieves waiting for this chunk to end
                at(t + latency, _REPLY, thief, piece(i))
            p.requests.clear()
            feed(t, i)
            if p.bag.is_empty():
                dry(t, i)
            else:
                work(t, i)
        elif kind == _ASK:
            if p.bag is None or at_once:
                at(t + latency, _REPLY, data, piece(i))
            else:
                p.requests.append(data)
        elif kind == _REPLY:
            p.stealing = False
            if data is not None:
                counts["random_won"] += 1
                take(t, i, data)
            elif p.pending:
                take(t, i, p.pending.pop())
            else:
                ask(t, i)
        elif kind == _REGISTER:
            loot = piece(i) if at_once and eager else None
            if loot is not None:     # an open bag answers the registration with a piece at once
                at(t + latency, _LOOT, data, (i, loot))
            elif data not in p.thieves:
                p.thieves.append(data)
        else:  # _LOOT from a lifeline
            giver, loot = data
            p.asked.discard(giver)
            counts["lifeline_won"] += 1
            if p.bag is not None or p.stealing:
                p.pending.append(loot)
            else:
                take(t, i, loot)
    total = counts["units"]
    return {"places": places, "n": n, "w": w, "lifeline": lifeline, "latency": latency,
            "at_once": at_once, "seconds": end, "efficiency": total * unit / (places * end) if end else 1.0,
            **counts}


def _quantiles(values: list[float], scale: float) -> dict[str, float | int | None]:
    ordered = sorted(values)

    def q(f: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(f * len(ordered)))] * scale, 2) if ordered else None
    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "samples": len(ordered)}


def glb_figures(params: dict, places: int, static: bool, stats: list[dict] | None,
                glb_args: dict[str, Any]) -> dict[str, Any]:
    """A GLB row's extras: steals (random and lifeline, won and failed), the wait for work
    and the random steals' round trips in ms, idle seconds per place, and the model's
    efficiency with instant steals (same tree, start, ``n``, ``w`` and lifelines)."""
    ideal = simulate(params, places, latency=0.0, at_once=True, static=static, **glb_args)
    out: dict[str, Any] = {"sim_instant": round(ideal["efficiency"], 4)}
    if not stats:
        return out
    total = {k: sum(s.get(k, 0) for s in stats) for k in
             ("random_tried", "random_won", "lifeline_asked", "lifeline_won", "split_at_once", "waited")}
    total["random_failed"] = total["random_tried"] - total["random_won"]
    total["lifeline_unanswered"] = total["lifeline_asked"] - total["lifeline_won"]
    idle = sorted(s["idle_s"] for s in stats)
    out.update({"steals": total,
                "wait_ms": _quantiles([x for s in stats for x in s.get("waits_s", [])], 1e3),
                "steal_rtt_ms": _quantiles([x for s in stats for x in s.get("steal_rtt_s", [])], 1e3),
                "idle_s": {"median": round(idle[len(idle) // 2], 3), "max": round(idle[-1], 3)}})
    return out


def render_glb(rows: list[dict]) -> list[str]:
    """One line per GLB row: its steals, latencies and idle time, and the model's figure."""
    lines = []
    for r in rows:
        if "sim_instant" not in r:
            continue
        head = f"{r['places']:>3} workers, {r['system']}: instant steals (model) {r['sim_instant']:.2f}"
        if "steals" not in r:
            lines.append(head)
            continue
        st, wait, rtt = r["steals"], r["wait_ms"], r["steal_rtt_ms"]
        lines.append(f"{head}; random steals {st['random_won']} won / {st['random_failed']} failed, "
                     f"lifelines {st['lifeline_won']} answered / {st['lifeline_unanswered']} not, "
                     f"{st['split_at_once']} split at once; wait for work p50/p90/p99 "
                     f"{wait['p50']}/{wait['p90']}/{wait['p99']} ms, steal round trip "
                     f"{rtt['p50']}/{rtt['p90']}/{rtt['p99']} ms; idle a place median "
                     f"{r['idle_s']['median']:.2f} s, max {r['idle_s']['max']:.2f} s")
    return lines
