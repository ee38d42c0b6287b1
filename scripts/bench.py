"""The psdp benchmark in one command (also ``psdp bench``); see ``docs/measurements/performance.md``.

python scripts/bench.py                    # full run: writes bench-results/bench.{md,json}
python scripts/bench.py --quick --out DIR  # the reduced form CI runs
python scripts/bench.py --only assembly stall
"""

from __future__ import annotations

import os
import sys

# 8 fake CPU devices, set before JAX starts (psdp imports it)
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from psdp.tools.benchmarks import main

if __name__ == "__main__":
    sys.exit(main())
