"""``python -m apgas.arrays.apps {jacobi,cg,nbody,sleep} ...``: see :mod:`apgas.arrays.apps._cli`."""

import sys

from apgas.arrays.apps._cli import main

sys.exit(main())
