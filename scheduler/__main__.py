"""``python -m scheduler``: the old name of ``python -m apgas_scheduler``, kept for one release."""
import sys

from apgas_scheduler.__main__ import main

print("note: 'python -m scheduler' is now 'python -m apgas_scheduler'; the old name goes away in 0.3",
      file=sys.stderr)
sys.exit(main())
