"""Imports on first use: optional dependencies (extras) and slow ones (``docs/guides/install.md``).

`import_optional` gives an optional dependency or an `ImportError` naming the extra that installs
it; `lazy_attributes` exports names whose module loads on first access (PEP 562).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any


def import_optional(module: str, *, extra: str, needed_for: str) -> ModuleType:
    """The module ``module``, or an `ImportError` saying which psdp extra installs it.

    Examples:
        >>> import_optional("json", extra="none", needed_for="this example").dumps([1])
        '[1]'
        >>> import_optional("no_such_module", extra="demo", needed_for="the demo")
        Traceback (most recent call last):
        ...
        ImportError: the demo needs no_such_module, which is not installed: pip install 'psdp[demo]'
    """
    try:
        with warnings.catch_warnings():
            # an import-time deprecation inside the dependency is its business, not the caller's
            # (haliax 1.4.dev453 imports jax.experimental.shard_map, deprecated since jax 0.8)
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module:
            raise  # the module is there but one of its own imports is missing: its message is clearer
        raise ImportError(
            f"{needed_for} needs {module}, which is not installed: pip install 'psdp[{extra}]'"
        ) from error


def lazy_attributes(
    package: str, names: Mapping[str, Iterable[str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``names`` (module -> attribute names).

    Each attribute's module is imported on the first access, and the value then stored in
    ``namespace`` (the package's ``globals()``), so later accesses are plain lookups.

    Examples:
        >>> namespace = {}
        >>> getattr_, dir_ = lazy_attributes("demo", {"json": ["dumps"]}, namespace)
        >>> getattr_("dumps")([1]), "dumps" in namespace, dir_()
        ('[1]', True, ['dumps'])
    """
    module_of = {name: module for module, attrs in names.items() for name in attrs}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return __getattr__, __dir__
