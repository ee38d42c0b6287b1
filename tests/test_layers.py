"""The house's layers hold: no module imports a layer above its own, and no import circle.

psdp's layers, bottom to top: ``_plan`` (pure) -> ``sources`` -> ``_runtime`` and ``prepare``
-> ``_integration`` -> the API (``psdp/__init__.py``) -> ``tools``; inside ``sources``:
``base`` <- ``stores`` <- ``documents`` <- ``views`` (``docs/concepts/architecture.md``). Every import is
read from the source with `ast`, those inside functions and under ``TYPE_CHECKING`` too, so a
lazy import that runs back up fails here as a top-level one would.
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
    "psdp.prepare": 2,
    "psdp._integration": 3,
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


def _layer(module: str) -> float:
    if module == "psdp":
        return API
    if module == "psdp.__main__":
        return LAYERS["psdp.tools"]
    if module.startswith(HELPERS):
        return -1
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def _imports(module: str) -> set[str]:
    """The psdp modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub`` when
    ``sub`` is a module)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: psdp uses none, but read them right if one comes
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: _imports(module) for module in MODULES}


def test_the_layers_are_read_from_the_modules():
    """The checks below see the modules and the arrows they must judge."""
    assert {"psdp.sources.stores.grain", "psdp.sources.views.packed"} <= set(MODULES)
    assert "psdp.sources.base" in GRAPH["psdp.sources.stores.grain"]
    # an import inside a function counts: open_documents loads the format on first use
    assert "psdp.sources.documents.format" in GRAPH["psdp.sources.documents.store"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module):
    above = sorted(name for name in GRAPH[module] if _layer(name) > _layer(module))
    assert not above, (
        f"{module} (layer {_layer(module)}) imports {above}, above it; move the shared code down "
        "to the lower layer, or the importing code up (layers: this file's docstring)"
    )


def test_no_import_circle_inside_psdp_sources():
    """Every circle among psdp.sources' modules (a package's __init__ importing its own modules
    is not one: it is what a package does)."""
    inside = {m: {n for n in GRAPH[m] if n.startswith("psdp.sources")} for m in MODULES}
    inside = {m: deps for m, deps in inside.items() if m.startswith("psdp.sources")}
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(inside[module]):
            if MODULES[dep].name == "__init__.py" and module.startswith(dep + "."):
                continue
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(inside):
        if module not in state:
            visit(module, [module])
    assert not circles, f"import circles in psdp.sources: {circles}; break each (layers: above)"
