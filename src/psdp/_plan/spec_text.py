"""The text forms of axis names and partition specs shared by configs and the command line:
``replica,data`` and ``(replica,data),context`` (``docs/guides/trainer.md``)."""

from __future__ import annotations

from typing import Any

from jax.sharding import PartitionSpec


def parse_names(text: str) -> tuple[str, ...]:
    """Parses a comma-separated list of axis names: ``"replica,data"`` -> ``("replica", "data")``.

    Examples:
        >>> parse_names("replica, data")
        ('replica', 'data')
    """
    names = tuple(part.strip() for part in text.split(","))
    bad = [name for name in names if not name.isidentifier()]
    if bad:
        raise ValueError(
            f"{bad[0]!r} is not an axis name; give comma-separated axis names, e.g. replica,data"
        )
    return names


def parse_spec(text: str) -> tuple[Any, ...]:
    """Parses a partition spec text into its entries, one per leaf dimension.

    Each entry is an axis name, several axis names as ``(a,b)`` or ``a+b``, or ``None``/``-`` for
    a replicated dimension. `spec_text` writes a spec back.

    Examples:
        >>> parse_spec("(replica,data),context")
        (('replica', 'data'), 'context')
        >>> parse_spec("data+fsdp,-")
        (('data', 'fsdp'), None)
    """
    return tuple(_spec_entry(entry) for entry in _split_top_level(text))


def spec_text(spec: PartitionSpec) -> str:
    """The text of ``spec`` that `parse_spec` reads back (for YAML and JSON).

    Examples:
        >>> spec_text(PartitionSpec(("replica", "data"), None, "context"))
        '(replica,data),-,context'
    """
    if not len(spec):
        raise ValueError("PartitionSpec() has no text form; write the strategy 'replicated'")
    return ",".join(
        "-" if entry is None else entry if isinstance(entry, str) else f"({','.join(entry)})"
        for entry in spec
    )


def _split_top_level(text: str) -> list[str]:
    """Splits on the commas outside parentheses."""
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(
                "parentheses are unbalanced or nested; group axes once, e.g. '(replica,data),context'"
            )
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("a '(' is not closed; group axes like '(replica,data)'")
    return [*entries, current]


def _spec_entry(entry: str) -> str | tuple[str, ...] | None:
    entry = entry.strip()
    if entry in ("None", "-"):
        return None
    if entry.startswith("(") and entry.endswith(")"):
        names = parse_names(entry[1:-1])
    else:
        names = tuple(part.strip() for part in entry.split("+"))
    if not all(name.isidentifier() for name in names):
        raise ValueError(
            f"entry {entry!r} is not an axis name, (a,b), a+b, None or -; e.g. '(replica,data),context'"
        )
    return names[0] if len(names) == 1 else names
