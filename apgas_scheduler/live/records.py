"""The live scheduler's job record: the engine's :class:`Tracked` state plus
what only a real job has (its spec, process and order address), kept in one
object so that the engine's transitions and the daemon's threads see the
same job."""

from __future__ import annotations

import os
from typing import Any

from apgas import auth

from ..engine import Tracked
from ..jobs import JobSpec
from .containment import JobProcess

__all__ = ["Job"]


class Job(Tracked):
    """A job and everything the scheduler knows of it."""

    def __init__(self, id: int, spec: JobSpec, submit: float, owner: int | None = None) -> None:
        super().__init__(id, spec.cls, spec.min_nodes, spec.max_nodes, spec.walltime, submit,
                         asks=spec.cls == "evolving")
        self.spec = spec
        self.reason = ""  # why it ended as it did
        self.proc: JobProcess | None = None  # our child, or adopted after a restart
        self.listen: tuple[str, int] | None = None  # where a malleable job takes orders
        self.reports = ""  # the address a malleable job puts into its messages
        self.owner = os.geteuid() if owner is None else owner  # the uid it runs as: its submitter's
        self.secret = auth.new_secret()  # signs its messages and our orders (APGAS_JOB_SECRET)
        self.plain = spec.protocol == "plain"  # unsigned, as the ElasticJobScheduler speaks
        self.request: str | None = None  # the client's key of its submit: a repeat is this job
        self.requeue_reason = ""  # why it last went back to the queue (requeues counts them)
        self.requeue_asked = ""  # a requeue asked for while it runs: it goes back once ended
        self.quick_ends = 0  # runs in a row that were lost soon after their start (processes.py)
        self.held_back = ""  # why it was not requeued although it might have been

    def __setattr__(self, name: str, value: Any) -> None:
        """Any change shows in the next view (the daemon's threads set fields)."""
        object.__setattr__(self, name, value)
        object.__setattr__(self, "cached", None)

    @property
    def kill_reason(self) -> str:
        """Why it is being killed ("" if it is not); a reason starting with
        "killed" ends it as failed, any other as cancelled."""
        return self.stopping

    @kill_reason.setter
    def kill_reason(self, reason: str) -> None:
        self.stopping = reason

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.spec.name, "class": self.spec.cls, "state": self.state,
                "nodes": list(self.nodes), "submit": self.submit, "start": self.start,
                "end": self.end, "reason": self.reason, "min_nodes": self.spec.min_nodes,
                "max_nodes": self.spec.max_nodes, "owner": self.owner, "ready": self.ready, "grows": self.grows,
                "shrinks": self.shrinks, "requested": self.requested,
                "requeue": self.spec.requeue, "requeues": self.requeues,
                "requeue_reason": self.requeue_reason,
                "listen": f"{self.listen[0]}:{self.listen[1]}" if self.listen else None}
