"""The house's layers hold: no module imports a layer above its own, and no import circle.

psdp's layers, bottom to top: ``_plan`` (pure) -> ``sources`` -> ``_runtime`` and ``prepare``
(siblings: neither imports the other) -> ``_integration`` -> ``orbax`` (optional) -> the API (``psdp/__init__.py``) ->
``tools``; inside ``sources``: ``base`` <- ``stores`` <- ``documents`` <- ``views``
(``docs/concepts/architecture.md``). Every import is read from the source with `ast`, those
inside functions and under ``TYPE_CHECKING`` too, so a lazy import that runs back up fails here
as a top-level one would; so do the modules named by string to `lazy_attributes` and
`importlib.import_module`, which load on first use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: module prefix -> its layer (higher imports lower); the longest matching prefix decides
LAYERS = {
    "psdp._plan": 0,
    "psdp.sources": 1.4,  # the package's __init__: the public names of the layers below
    "psdp.sources.base": 1.0,
    "psdp.sources.stores": 1.1,
    "psdp.sources.documents": 1.2,
    "psdp.sources.views": 1.3,
    "psdp._runtime": 2,
    "psdp.prepare": 2,  # _runtime's sibling: at one height, two rooms import neither way
    "psdp._integration": 3,
    "psdp.orbax": 3.5,  # Orbax's checkpoint args: it imports orbax, so `psdp` never imports it
    "psdp.levanter": 4.5,  # psdp as Levanter's data loader: above the API, below the tools
    "psdp.tools": 5,
}
#: psdp's helper modules, below every layer (they import nothing of psdp's layers)
HELPERS = ("psdp._checks", "psdp._compat", "psdp._deprecated", "psdp._imports")
API = 4  # psdp/__init__.py; psdp/__main__.py is the command, with tools


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted((SRC / "psdp").rglob("*.py"))}


def _room(module: str) -> str:
    """The layer's name (a `LAYERS` prefix, ``psdp`` or a helper) that ``module`` lives in."""
    if module in ("psdp", "psdp.__main__") or module.startswith(HELPERS):
        return "psdp.tools" if module == "psdp.__main__" else module
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def _layer(module: str) -> float:
    if module == "psdp":
        return API
    if module.startswith(HELPERS):
        return -1
    return LAYERS[_room(module)]


def _may_import(module: str, name: str) -> bool:
    """Lower layers only, or its own room; never a sibling room at the same height."""
    if _layer(name) == _layer(module):
        return _room(name) == _room(module) or _layer(module) == -1
    return _layer(name) < _layer(module)


def _from(base: str, names: list[str]) -> set[str]:
    """What ``from base import names`` loads: ``base.name`` for a name that is a module (the
    package ``base`` is then only its parent, loaded first as every parent is), else ``base``
    itself, whose code must have run to define the name."""
    submodules = {f"{base}.{name}" for name in names if f"{base}.{name}" in MODULES}
    return submodules | ({base} if len(submodules) < len(names) else set())


def _strings(node: ast.expr, constants: dict[str, ast.expr]) -> list[str]:
    """The string constants of ``node`` (a list or tuple of them, or a module-level name bound
    to one)."""
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


def _imports(module: str) -> set[str]:
    """The psdp modules ``module`` imports: import statements, ``lazy_attributes``' mapping
    (module -> names) and ``importlib.import_module("...")`` with a literal name."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    constants = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: psdp uses none, but read them right if one comes
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found |= _from(base, [alias.name for alias in node.names])
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.endswith("lazy_attributes") and len(node.args) >= 2:
                mapping = node.args[1]
                if isinstance(mapping, ast.Name):
                    mapping = constants.get(mapping.id, mapping)
                if isinstance(mapping, ast.Dict):
                    for key, value in zip(mapping.keys, mapping.values, strict=True):
                        if isinstance(key, ast.Constant) and isinstance(key.value, str):
                            found |= _from(key.value, _strings(value, constants))
            elif name.endswith("import_module") and node.args:
                if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    found.add(node.args[0].value)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: _imports(module) for module in MODULES}


def test_the_layers_are_read_from_the_modules():
    """The checks below see the modules and the arrows they must judge."""
    assert {"psdp.sources.stores.grain", "psdp.sources.views.packed"} <= set(MODULES)
    assert "psdp.sources.base" in GRAPH["psdp.sources.stores.grain"]
    # an import inside a function counts: open_documents loads the format on first use
    assert "psdp.sources.documents.format" in GRAPH["psdp.sources.documents.store"]
    # a name loaded on first use by string counts: lazy_attributes' mapping, import_module
    assert {"psdp.sources.documents.writer", "psdp.prepare"} <= GRAPH["psdp"]
    assert "psdp.sources.stores.tensorstore" in GRAPH["psdp.sources"]
    # `from pkg import sub` is an arrow to the submodule, `from pkg import name` to pkg itself
    assert _from("psdp.sources", ["views", "Source"]) == {"psdp.sources.views", "psdp.sources"}
    assert _from("psdp.sources", ["views"]) == {"psdp.sources.views"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module):
    above = sorted(name for name in GRAPH[module] if not _may_import(module, name))
    assert not above, (
        f"{module} (layer {_layer(module)}, {_room(module)}) imports {above}, above it or its "
        "sibling at the same height; move the shared code down to the lower layer, or the "
        "importing code up (layers: this file's docstring)"
    )


def test_no_import_circle_in_psdp():
    """Every circle among psdp's modules. A submodule's parent package is loaded before it and
    is no arrow of its own; a submodule that imports *names* from its package's ``__init__``
    is one, and a circle when that ``__init__`` imports the submodule: ``import psdp`` then
    fails with "partially initialized module"."""
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not circles, f"import circles in psdp: {circles}; break each (layers: above)"
