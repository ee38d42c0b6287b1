"""The planner: pure functions of a mesh, its layout and the loader's options (no threads, no I/O).

See ``docs/concepts/architecture.md``.
"""
