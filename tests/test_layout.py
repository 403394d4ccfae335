"""The shape of the code (DESIGN section 4): odekit's import graph, read from the source.

Every ``import`` and ``from ... import`` of every module of ``odekit/``, at
module level or inside a function (``loop.py`` imports the progress meter
lazily), is an edge of the module graph. ``from package import name`` is an
edge to the submodule ``package.name`` when there is one, else to the
package's ``__init__``. The graph must

(a) have no cycles;
(b) import no private (underscore) name from another module, neither by
    ``from m import _name`` nor as ``m._name`` (a private *module* such as
    ``odekit._lax`` is allowed);
(c) respect the floors of ``odekit/ode/``: linalg at the bottom, methods
    above it, then the engine, the adjoints, and the front ends on top; a
    module imports only modules on its own floor or below.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "odekit"

# Floors of odekit.ode, lowest first; a module's floor is that of its longest prefix.
FLOORS = {
    "odekit.ode.linalg": 0,
    "odekit.ode.methods": 1,
    "odekit.ode.engine": 2,
    "odekit.ode.adjoints": 3,
    "odekit.ode.arguments": 4,
    "odekit.ode.odeint": 4,
    "odekit.ode.solve_ivp": 4,
    "odekit.ode": 4,          # the package's __init__: public re-exports
}
NAMES = {0: "linalg", 1: "methods", 2: "engine", 3: "adjoints", 4: "front ends"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module name of a ``from`` import (relative ones included)."""
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(module: str):
    """``(target, lineno, bound_name_or_None, imported_name_or_None)`` for each
    odekit module ``module`` imports; ``bound`` is the local name of an
    imported *module*, ``imported`` the name taken from a module."""
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    bound = alias.asname if alias.asname else None
                    yield alias.name, node.lineno, bound, None
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            if base not in MODULES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    yield sub, node.lineno, alias.asname or alias.name, None
                else:
                    yield base, node.lineno, None, alias.name


GRAPH = {m: sorted({target for target, *_ in _imports(m)} - {m}) for m in MODULES}


def _floor(module: str) -> int | None:
    for prefix in sorted(FLOORS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return FLOORS[prefix]
    return None


def test_the_graph_is_read():
    # the lazy, function-level import of the progress meter is an edge
    assert "odekit.ode.engine.progress" in GRAPH["odekit.ode.engine.loop"]
    assert "odekit.ode.methods" in GRAPH["odekit.ode.engine.loop"]
    assert "odekit.ode.linalg.lu" in GRAPH["odekit.ode.methods.esdirk_step"]


def test_no_import_cycles():
    state: dict[str, int] = {}     # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str):
        state[module] = 1
        path.append(module)
        for target in GRAPH[module]:
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in GRAPH:
        if module not in state:
            visit(module)


def test_no_private_names_imported_across_modules():
    found = []
    for module in MODULES:
        bound = {}
        for target, line, name, imported in _imports(module):
            if imported is not None and _is_private(imported) and target != module:
                found.append(f"{module}:{line}: from {target} import {imported}")
            if name is not None:
                bound[name] = target
        for node in ast.walk(TREES[module]):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound and _is_private(node.attr) \
                    and f"{bound[node.value.id]}.{node.attr}" not in MODULES:
                found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr} "
                             f"({bound[node.value.id]})")
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_every_ode_module_has_a_floor():
    """A new module of odekit.ode goes into one of the subpackages (or is a
    front end); a new subpackage gets its floor in FLOORS."""
    stray = [m for m in MODULES if m.startswith("odekit.ode") and _floor(m) is None]
    assert not stray, stray


def test_imports_respect_the_floors():
    """linalg < methods < engine < adjoints < front ends: nothing imports upwards."""
    upward = []
    for module, targets in GRAPH.items():
        floor = _floor(module)
        for target in targets:
            if floor is None or not target.startswith("odekit.ode"):
                continue
            if _floor(target) > floor:
                upward.append(f"{module} ({NAMES[floor]}) imports {target} "
                              f"({NAMES[_floor(target)]})")
    assert not upward, "\n".join(upward)


def test_public_import_paths():
    import odekit
    import odekit.ode

    assert odekit.Checkpoint is odekit.ode.Checkpoint
    assert odekit.Interpolate is odekit.ode.Interpolate
    assert odekit.solve_ivp is odekit.ode.solve_ivp
    assert odekit.odeint is odekit.ode.odeint
    assert odekit.ODESolverError is odekit.ode.ODESolverError
    assert "dopri5" in odekit.ode.METHODS and "dopri5" in odekit.ode.EXPLICIT_METHODS
    assert odekit.ode.IVPSolution.__name__ == "IVPSolution"
    from odekit.ode.methods import get_method, method_table  # the registry's face
    assert get_method("tsit5").name == "tsit5" and method_table().startswith("| method")
