"""``python -m glb.apps {uts,nqueens,bc,pi} ...``: see :mod:`glb.apps.cli`."""

import sys

from glb.apps.cli import main

sys.exit(main())
