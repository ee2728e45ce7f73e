"""pytest setup for the Python tests of gdr.

The test problems are tiny: one OpenMP thread each for gdr's core and torch avoids spinning
thread teams on a shared 2-core machine (set OMP_NUM_THREADS yourself to override).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
