"""An elastic batch job scheduler for rigid, moldable, malleable and evolving jobs.

The policies (``apgas_scheduler.policies``) are plain objects shared by the live
daemon (``apgas_scheduler.daemon``) and the simulator; ``python -m apgas_scheduler`` is
the command line.
"""

from ._model import Grow, JobView, Shrink, Start
from .jobs import JobFileError, JobSpec, load_job_file, parse_job

__all__ = ["JobView", "Start", "Grow", "Shrink", "JobSpec", "JobFileError", "load_job_file",
           "parse_job"]
