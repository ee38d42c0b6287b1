"""The runtime: the `DataLoader`, its feeds, step reads, assembly, prefetch threads and telemetry.

See ``docs/concepts/architecture.md``.
"""
