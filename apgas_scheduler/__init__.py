"""An elastic batch job scheduler for rigid, moldable, malleable and evolving jobs.

The package has the shape of its architecture:

- at the root, what every part shares: the model policies see and decide with
  (``_model``), the engine that holds the cluster's state and checks every
  decision (``engine``), the metrics of a run (``stats``, ``metrics``), job files
  (``jobs``) and the client (``client``);
- ``policies``: the scheduling policies, pure functions of a snapshot, and the
  registry that finds them by name;
- ``live``: the daemon, real processes on real nodes around the engine;
- ``sim``: the discrete-event simulator, workloads and traces, around the same
  engine and policies;
- ``slurm``: Slurm as the scheduler (``APGAS_COMMUNICATOR=slurm``).

``python -m apgas_scheduler`` is the command line.
"""

from ._model import Grow, JobView, Shrink, Start
from .jobs import JobFileError, JobSpec, load_job_file, parse_job

__all__ = ["JobView", "Start", "Grow", "Shrink", "JobSpec", "JobFileError", "load_job_file",
           "parse_job"]
