"""``python -m psdp``: the same as the ``psdp`` console script."""

from psdp.tools.cli import main

raise SystemExit(main())
