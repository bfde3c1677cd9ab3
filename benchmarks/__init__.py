"""Measurement harnesses of the APGAS runtime, GLB and the scheduler (``python -m
benchmarks.micro``, ``.peers``, ``.scaling`` ...). Some need the ``bench`` extra
(Dask, matplotlib); the applications they measure are :mod:`glb.apps`."""
