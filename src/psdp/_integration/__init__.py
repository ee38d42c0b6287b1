"""What a trainer plugs in: configs, `filter_shard` and the cross-host consistency check.

See ``docs/concepts/architecture.md``.
"""
