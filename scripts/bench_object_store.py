"""The object-store figure alone (``psdp bench --only object_store``): moto's S3 server on
127.0.0.1, 0 and 50 ms injected per request, full vs block shuffle; see ``docs/guides/stores.md``.

python scripts/bench_object_store.py                   # full sizes: bench-results/bench.{md,json}
python scripts/bench_object_store.py --quick --out DIR # tiny sizes, seconds
"""

from __future__ import annotations

import os
import sys

# 8 fake CPU devices, set before JAX starts (psdp imports it)
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from psdp.tools.benchmarks import main

if __name__ == "__main__":
    sys.exit(main(["--only", "object_store", *sys.argv[1:]]))
