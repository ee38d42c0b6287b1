"""The previous release's spellings, kept for one more release (``docs/guides/trainer.md``, "Deprecated names").

A name that moved still works until psdp `REMOVED_IN`, and warns once with the new spelling: the
module paths of the flat layout (``psdp.config``, ``psdp.pod``, ...), served by an import hook that
hands back the module now at the new path, and `LoaderConfig`'s flat fields and ``loader_kwargs``
(``_integration/loader_config.py`` maps them onto the option groups and calls `warn_deprecated`).

The warning is a `FutureWarning`, not a `DeprecationWarning`: Python shows a DeprecationWarning only
when it is attributed to ``__main__``, and these are raised inside the import system or draccus's
config parsing, so it would stay hidden from the trainer's author, who must edit the trainer
before the names go.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, FrameType, ModuleType
from typing import Any

#: The release that no longer has the deprecated names.
REMOVED_IN = "0.2.0"

#: module of the previous release -> (the module at its place now, what to write instead)
MOVED_MODULES = {
    "psdp.config": ("psdp._integration.loader_config", "from psdp import LoaderConfig, MeshConfig"),
    "psdp.consistency": ("psdp._integration.consistency", "from psdp import check_consistency"),
    "psdp.sharding": ("psdp._integration.filter_shard", "from psdp import filter_shard"),
    "psdp.writer": ("psdp.sources.stores.writer", "from psdp import write_dataset"),
    "psdp.layout": ("psdp._plan.layout", "from psdp import MeshLayout"),
    "psdp.mesh": ("psdp._plan.mesh", "from psdp import plan_batch, process_mesh_mapping"),
    "psdp.order": ("psdp._plan.order", "from psdp import GlobalOrder"),
    "psdp.partition": ("psdp._plan.partition", "from psdp import default_batch_spec"),
    "psdp.loader": ("psdp._runtime.loader", "from psdp import DataLoader"),
    "psdp.prefetch": ("psdp._runtime.prefetch", "from psdp import LoaderClosedError"),
    "psdp.telemetry": ("psdp._runtime.telemetry", "from psdp import LoaderStats"),
    "psdp.pod": ("psdp.tools.pod", "from psdp.tools.pod import run_pod"),
    "psdp.simulate": ("psdp.tools.simulate", "import psdp.tools.simulate"),
    "psdp.benchmarks": ("psdp.tools.benchmarks", "import psdp.tools.benchmarks"),
    "psdp.cli": ("psdp.tools.cli", "the psdp command, or import psdp.tools.cli"),
    # internal machinery, named in the previous release's docs: no public replacement
    "psdp.agreement": ("psdp._runtime.agreement", None),
    "psdp.assembly": ("psdp._runtime.assembly", None),
    "psdp.reads": ("psdp._plan.reads", None),
    "psdp.picture": ("psdp._plan.picture", None),
    "psdp.dtypes": ("psdp._plan.dtypes", None),
    # psdp.sources' flat modules, in folders by what they are (stores/, documents/, views/); the
    # module psdp.sources.documents is a package now, its names served by its __getattr__
    "psdp.sources.errors": (
        "psdp.sources.stores.errors",
        "from psdp.sources.stores.errors import TransientReadError",
    ),
    "psdp.sources.location": (
        "psdp.sources.stores.location",
        "from psdp.sources.stores import location",
    ),
    "psdp.sources.remote": ("psdp.sources.stores.remote", "from psdp.sources.stores import remote"),
    "psdp.sources.tensorstore": (
        "psdp.sources.stores.tensorstore",
        "from psdp.sources import TensorStoreSource",
    ),
    "psdp.sources.memmap": ("psdp.sources.stores.memmap", "from psdp.sources import MemmapSource"),
    "psdp.sources.grain": ("psdp.sources.stores.grain", "from psdp.sources import GrainSource"),
    "psdp.sources.streams": (
        "psdp.sources.stores.streams",
        "from psdp.sources import StreamSource",
    ),
    "psdp.sources.writer": ("psdp.sources.stores.writer", "from psdp import write_dataset"),
    "psdp.sources.levanter": (
        "psdp.sources.documents.levanter",
        "from psdp.sources import open_levanter_cache",
    ),
    "psdp.sources.document_index": (
        "psdp.sources.documents.index",
        "from psdp.sources import DocumentIndex",
    ),
    "psdp.sources.document_parts": (
        "psdp.sources.documents.parts",
        "from psdp.sources.documents import parts",
    ),
    "psdp.sources.document_writer": (
        "psdp.sources.documents.writer",
        "from psdp import write_documents",
    ),
    "psdp.sources.tokens": ("psdp.sources.views.tokens", "from psdp import TokenSequences"),
    "psdp.sources.packed": ("psdp.sources.views.packed", "from psdp import PackedSequences"),
    "psdp.sources.pack_index": (
        "psdp.sources.views.pack_index",
        "from psdp.sources.views import pack_index",
    ),
    "psdp.sources.mixture": ("psdp.sources.views.mixture", "from psdp import Mixture"),
    "psdp.sources.provenance": (
        "psdp.sources.views.provenance",
        "from psdp.sources.views import provenance",
    ),
}


_PSDP = os.path.dirname(__file__) + os.sep  # psdp's own frames: the user is further out


def warn_deprecated(old: str, new: str) -> None:
    """Warns that ``old`` goes away in `REMOVED_IN`, naming ``new``, blaming the user's line.

    Examples:
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_deprecated("psdp.old", "use psdp.new")
        >>> str(caught[0].message), caught[0].category.__name__
        ('psdp.old is deprecated and goes away in psdp 0.2.0; use psdp.new', 'FutureWarning')
    """
    warnings.warn(
        f"{old} is deprecated and goes away in psdp {REMOVED_IN}; {new}",
        FutureWarning,
        stacklevel=_user_level(),
    )


def warn_moved_name(old_module: str, name: str, new_module: str, public_module: str) -> Any:
    """``name`` of ``new_module``, warning that ``old_module.name`` goes: for an old module path
    that is a package now, whose ``__getattr__`` serves the old module's names.

    Examples:
        >>> import json
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     value = warn_moved_name("psdp.old", "dumps", "json", "json")
        >>> value is json.dumps, str(caught[0].message)
        (True, 'psdp.old.dumps is deprecated and goes away in psdp 0.2.0; write `from json import dumps` (it is json.dumps now)')
    """
    warn_deprecated(
        f"{old_module}.{name}",
        f"write `from {public_module} import {name}` (it is {new_module}.{name} now)",
    )
    return getattr(importlib.import_module(new_module), name)


def _user_level() -> int:
    """The stack level of the first frame outside psdp, importlib and dataclasses' __init__."""
    frame: FrameType | None = sys._getframe(2)  # warn_deprecated's caller
    level = 2
    while frame is not None and _internal(frame.f_code):
        name = frame.f_code.co_filename
        # warnings.warn skips importlib's _bootstrap frames itself: they take no level
        level += not ("importlib" in name and "_bootstrap" in name)
        frame = frame.f_back
    return level


def _internal(code: CodeType) -> bool:
    return (
        code.co_filename.startswith(("<frozen importlib", _PSDP))
        or code.co_filename == importlib.__file__
        # the __init__ that dataclasses generate, which runs LoaderConfig.__post_init__
        or (code.co_filename == "<string>" and code.co_name == "__init__")
    )


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import hook: ``import psdp.config`` gives the module now at
    ``psdp._integration.loader_config`` (the same object, so every name is the new one), with a
    warning; a submodule of a moved package (``psdp.benchmarks.throughput``) is the new
    package's."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if _moved(fullname) else None

    def exec_module(self, module: ModuleType) -> None:
        old = _moved(module.__name__)
        assert old is not None  # find_spec made the spec for a moved name only
        new, instead = MOVED_MODULES[old]
        if module.__name__ == old:
            hint = f"write `{instead}`" if instead else "its names are psdp's internals now"
            warn_deprecated(old, f"{hint} (the module is {new} now)")
        # the import system returns what sys.modules holds once the module ran: the new module
        sys.modules[module.__name__] = importlib.import_module(new + module.__name__[len(old) :])


def _moved(name: str) -> str | None:
    """The moved module that ``name`` is, or is inside of."""
    return next((old for old in MOVED_MODULES if name == old or name.startswith(old + ".")), None)


def install() -> None:
    """Puts the import hook in front of the others (once)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
