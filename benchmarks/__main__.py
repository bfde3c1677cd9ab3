"""``python -m benchmarks {uts,nqueens,bc,pi} ...``: the old name of ``python -m glb.apps``,
kept for one release; it says so on stderr and runs the same command line."""

import sys

from glb.apps.cli import main

print("note: the GLB applications moved: run `python -m glb.apps ...` "
      "(`python -m benchmarks` goes in the next release)", file=sys.stderr)
sys.exit(main(prog="python -m glb.apps"))
