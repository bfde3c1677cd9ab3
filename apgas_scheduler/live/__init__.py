"""The live scheduler: the daemon (:mod:`.daemon`) and its parts, real processes on
real nodes around the engine (:mod:`apgas_scheduler.engine`)."""
