"""``python -m apgas.dist.apps {jacobi,cg,nbody,sleep} ...``: see :mod:`apgas.dist.apps._cli`."""

import sys

from apgas.dist.apps._cli import main

sys.exit(main())
