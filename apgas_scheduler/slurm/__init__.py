"""``APGAS_COMMUNICATOR=slurm``: a malleable or evolving program resizes its own Slurm job.

Slurm is then the scheduler. Inside a Slurm job (``sbatch`` or ``salloc``,
with one place per node), the program's evolving calls act on the job itself,
as the DMR API's Slurm plug-in does (Iserte et al.):

- ``apgas.request_grow(n)``: Slurm is asked for ``n`` more whole nodes, which
  join the job (:mod:`apgas_scheduler.slurm.commands`), and one place is started on
  each with ``srun``. When Slurm gives none within ``APGAS_SLURM_GROW_TIMEOUT``
  seconds, or refuses, the request is refused with Slurm's reason
  (:class:`apgas.GrowRefused`) and the waiting allocation is cancelled.
- ``apgas.release_places(places)``: the places drain and stop (the handler
  runs as for any shrink), then the nodes left without a place go back to
  Slurm (``scontrol update ... NodeList=``).
- ``apgas.check_status(min, max, preferred, factor)``: DMR's decision, by the
  same code as the scheduler's ``dmr`` policy (:func:`apgas_scheduler.policies.dmr.dmr_answer`),
  from Slurm's view of the partition: its idle nodes, the pending jobs that
  could start and the running ones; then carried out as above.
- Orders of ``apgas-scheduler slurm-controller`` (our policies beside
  slurmctld): once the program defines its handler, the job says ``apgas
  ready`` in its ``Comment`` and reads grow and shrink orders from its
  ``AdminComment`` (:mod:`apgas_scheduler.slurm.inbox`), carried out as above,
  and answered ``apgas done N`` or ``apgas failed N``.

Sizes are counted in places, one per node (the job's first node keeps place 0
and is never given back). After each resize the program's Slurm variables
(``SLURM_JOB_NODELIST``, ``SLURM_NNODES``, ``SLURM_JOB_CPUS_PER_NODE`` ...)
are what Slurm's own resize script sets, since ``srun`` trusts them. Slurm itself
sends no orders; the controller's come through Slurm's job fields, and the
job opens no port. The timing lines go to the log (``apgas.malleability``).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import math
import os
import queue
import threading
import time

from apgas import protocol
from apgas.errors import ApgasError, ConfigError
from apgas.lowlevel import Config
from apgas.malleable import MalleableCommunicator, Orders
from apgas.protocol import ascii_int

from .._model import Grow, JobView, Shrink
from ..policies.dmr import dmr_answer
from . import commands as slurmctl
from . import mailbox
from .inbox import Inbox

__all__ = ["SlurmCommunicator"]

log = logging.getLogger("apgas.slurm")

#: s past the second in which the job gave a node back before a step may start on it
#: again (slurmd refuses credentials made in the second they were revoked)
REVOKED_MARGIN_S = 0.05

#: Why a pending job cannot start, for the reasons DMR may shrink a job for it.
STARTABLE = ("Resources", "Priority", "None")


class SlurmCommunicator(MalleableCommunicator):
    """The program's own Slurm job is what grows and shrinks; see the module docstring."""

    def __init__(self, orders: Orders, config: Config) -> None:
        super().__init__(orders, config)
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        if not self.job_id:
            raise ConfigError("APGAS_COMMUNICATOR=slurm works inside a Slurm job (sbatch or "
                              "salloc), and SLURM_JOB_ID is not set")
        try:
            permitted = slurmctl.expansion_permitted()
            job = slurmctl.show_job(self.job_id)
        except slurmctl.SlurmError as e:
            raise ConfigError(f"APGAS_COMMUNICATOR=slurm: cannot ask Slurm about job "
                              f"{self.job_id}: {e}") from None
        self.grow_by = config.slurm_grow or ("expand" if permitted else "companion")
        if self.grow_by == "expand" and not permitted:
            raise ConfigError("APGAS_SLURM_GROW=expand: this Slurm does not let jobs grow; the "
                              "administrator must add permit_job_expansion to SchedulerParameters "
                              "in slurm.conf (SchedulerParameters=permit_job_expansion) and run "
                              "scontrol reconfigure, or use APGAS_SLURM_GROW=companion")
        self.end = _end_time(job.fields.get("EndTime", ""))
        self.companions: dict[str, str] = {}  # node -> the companion allocation it is in
        self.partition = job.partition
        self.nodes = job.nodes
        self.first = job.nodes[0] if job.nodes else ""
        self._resizing = threading.Lock()  # one change of the Slurm job at a time
        self._released: dict[str, float] = {}  # node -> when the job gave it back
        # (verb, nodes, asked by the program, the controller's order number or 0)
        self._work: queue.SimpleQueue[tuple[str, int, bool, int] | None] = queue.SimpleQueue()
        self._inbox = Inbox(self.job_id, self._take_order, config.slurm_poll)
        self._worker = threading.Thread(target=self._run, name="apgas-slurm", daemon=True)
        # address: None, as the base class has it (Slurm sends no orders: nothing listens)

    # -- the communicator ----------------------------------------------------------------
    def start(self) -> None:
        log.info("resizing Slurm job %s (partition %s, nodes %s)", self.job_id, self.partition,
                 ",".join(self.nodes))
        self._worker.start()
        self._inbox.open()

    def stop(self) -> None:
        self._inbox.close()
        self._work.put(None)
        if self._worker.is_alive():
            self._worker.join(self.config.slurm_grow_timeout + 60)
        for companion in sorted(set(self.companions.values())):  # their nodes go back now
            slurmctl.cancel(companion)
        self.companions.clear()
        _publish(self.companions)

    def _take_order(self, order: mailbox.Order) -> None:
        self._work.put((order.verb, order.nodes, False, order.seq))

    @property
    def attached(self) -> bool:
        return True

    def report(self, message: str) -> None:
        parsed = protocol.parse_message(message)
        if parsed.kind == "release":
            self._give_back()
        else:
            log.info("%s", message)

    def ask(self, message: str) -> concurrent.futures.Future[str]:
        parsed = protocol.parse_message(message)
        answer: concurrent.futures.Future[str] = concurrent.futures.Future()
        if parsed.kind == "request":
            n = ascii_int(";".join(parsed.fields)) or 0
            if n < 1:
                answer.set_exception(ApgasError(f"bad request {message!r}: the count must be a "
                                                "positive integer"))
                return answer
            answer.set_result(f"ok {n}")
            self._work.put(("grow", n, True, 0))
        elif parsed.kind == "check":
            try:
                answer.set_result(self._check(*protocol.parse_check(parsed)))
            except Exception as e:  # Slurm could not be asked: check_status says why
                answer.set_exception(ApgasError(f"DMR's check through Slurm failed: {e}"))
        else:
            answer.set_exception(ApgasError(f"the slurm communicator cannot ask {message!r}"))
        return answer

    # -- DMR's decision from Slurm's view -------------------------------------------------
    def _check(self, low: int, high: int, preferred: int, factor: int) -> str:
        view = slurmctl.partition_view(self.partition, self.job_id)
        now = time.time()
        places = len(self.orders.status()[1])
        me = JobView(id=_number(self.job_id), cls="evolving", min_nodes=low,
                     max_nodes=max(low, min(high, view.total)), walltime=365 * 86400.0,
                     submit=now, nodes=places, start=now, resizable=True,
                     preferred=preferred, asks=True)
        waiting = [JobView(_number(j.id), "rigid", j.nodes, j.nodes, j.limit, j.time)
                   for j in view.pending if j.reason in STARTABLE]
        running = [JobView(_number(j.id), "rigid", j.nodes, j.nodes, j.limit, j.time,
                           nodes=j.nodes, start=j.time) for j in view.running] + [me]
        decision = dmr_answer(now, me, waiting, running, view.idle, view.total, factor)
        log.info("DMR check [%d, %d] preferred %d factor %d with %d place(s), %d idle node(s), "
                 "%d pending job(s): %s", low, high, preferred, factor, places, view.idle,
                 len(waiting), decision or "no action")
        if isinstance(decision, Grow):
            self._work.put(("grow", decision.nodes, False, 0))
            return f"expand {places + decision.nodes}"
        if isinstance(decision, Shrink):
            self._work.put(("shrink", decision.nodes, False, 0))
            return f"shrink {places - decision.nodes}"
        return "none"

    # -- carrying it out ------------------------------------------------------------------
    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            verb, n, requested, seq = item
            try:
                if verb == "grow":
                    self._grow(n)
                else:
                    self.orders.shrink(n, lambda hosts: self._give_back())
            except Exception as e:
                reason = str(e)
                log.warning("%s %d through Slurm failed: %s", verb, n, reason)
                if requested:
                    self.orders.refused(n, reason)
                else:
                    self.orders.order_failed(reason)
                if seq:
                    self._inbox.answer("failed", seq)
            else:
                if seq:
                    self._inbox.answer("done", seq)

    def _grow(self, n: int) -> None:
        """``n`` more nodes from Slurm, then a place on each; the nodes go back if
        the places cannot start."""
        if self.grow_by == "companion":
            self._grow_companion(n)
            return
        expansion = slurmctl.allocate_expansion(self.job_id, n, self.partition,
                                                self.config.slurm_grow_timeout)
        with self._resizing:  # not while Slurm finds the nodes: a release may go meanwhile
            before = list(self.nodes)
            try:
                self._follow(slurmctl.merge_expansion(self.job_id, expansion))
            except slurmctl.SlurmError:
                self._follow({})
                raise
            new = [node for node in self.nodes if node not in before]
            log.info("Slurm job %s grew by %s", self.job_id, ",".join(new))
        if not new:
            raise ApgasError(f"Slurm merged expansion {expansion} into job {self.job_id} but "
                             "the job has no new node")
        # A node's slurmd revoked the job's credentials when the job gave it back, and
        # refuses a step whose credential is from the same second ("Job credential
        # revoked"): a node given back just now is used once that second is over.
        pause = max((math.floor(self._released.get(node, 0.0)) + 1 + REVOKED_MARGIN_S
                     - time.time() for node in new), default=0.0)
        if pause > 0:
            log.info("waiting %.2f s: the job gave %s back within the second", pause, ",".join(new))
            time.sleep(pause)
        try:
            self.orders.grow(len(new), new)
        except Exception:
            self._give_back()  # the places did not start: the nodes go back at once
            raise

    def _grow_companion(self, n: int) -> None:
        """``n`` nodes in a companion allocation (:func:`slurmctl.allocate_companion`),
        then a place on each as a step of it."""
        companion, new = slurmctl.allocate_companion(self.job_id, n, self.partition,
                                                     self.config.slurm_grow_timeout, self.end)
        with self._resizing:
            self.companions.update((node, companion) for node in new)
            _publish(self.companions)
        log.info("Slurm job %s grew by %s (companion allocation %s)", self.job_id,
                 ",".join(new), companion)
        try:
            self.orders.grow(len(new), new)
        except Exception:
            self._give_back()
            raise

    def _give_back(self) -> None:
        """Shrink the Slurm job, and its companions, to the nodes that still have a
        place (and the first)."""
        with self._resizing:
            hosts = {place.host for place in self.orders.status()[1]}
            for companion in sorted(set(self.companions.values())):
                mine = [node for node, c in self.companions.items() if c == companion]
                keep = [node for node in mine if node in hosts]
                if keep == mine:
                    continue
                if keep:
                    slurmctl.shrink_job(companion, keep)
                else:
                    slurmctl.cancel(companion)
                for node in mine:
                    if node not in keep:
                        del self.companions[node]
                log.info("companion allocation %s of Slurm job %s gave back %s", companion,
                         self.job_id, ",".join(n for n in mine if n not in keep))
            _publish(self.companions)
            keep = [node for node in self.nodes if node in hosts or node == self.first]
            if keep == self.nodes:
                return
            gone = [node for node in self.nodes if node not in keep]
            self._follow(slurmctl.shrink_job(self.job_id, keep))
            now = time.time()
            self._released.update((node, now) for node in gone)
            log.info("Slurm job %s gave back %s", self.job_id, ",".join(gone))

    def _follow(self, changes: dict[str, str | None]) -> None:
        """Take the job's nodes from Slurm, and its variables as Slurm's resize
        script sets them (``srun``, which starts the places, trusts them)."""
        self.nodes = slurmctl.show_job(self.job_id).nodes
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if not changes:  # Slurm wrote no script: the node variables, at least
            listed = ",".join(self.nodes)
            for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
                os.environ[name] = listed
            for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
                os.environ[name] = str(len(self.nodes))


def _publish(companions: dict[str, str]) -> None:
    """Tell the srun launcher which nodes are a companion allocation's
    (``APGAS_SLURM_COMPANIONS``: its places there run as that job's steps)."""
    os.environ["APGAS_SLURM_COMPANIONS"] = ",".join(f"{n}={c}" for n, c in sorted(companions.items()))


def _end_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:  # Unknown: no time limit
        return None


def _number(job_id: str) -> int:
    """A Slurm job id as a number for the policy (array tasks ``12_3`` hash apart)."""
    number = ascii_int(job_id, max_digits=9)
    return number if number is not None else abs(hash(job_id)) % 10**9 + 10**9
