"""psdp's tools: the ``psdp`` command line, the local pod, the pod simulator and the benchmarks.

See ``docs/concepts/architecture.md``.
"""
