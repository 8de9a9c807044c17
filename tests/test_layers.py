"""The layout shows the layers: dit_sp's packages import only packages below them (in ``LAYERS``), there is no
import cycle between modules, and nothing in dit_sp imports the CLIs (``pipelines``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dit_sp"

LAYERS = [
    {"errors", "_compat", "_lazy"},
    {"parallel"},
    {"attention"},
    {"io", "vae", "weights"},
    {"families"},
    {"cache"},
    {"sp"},
    {"zoo", "train"},
    {"memory", "inference"},
    {"rl"},
    {"toy", "server"},
    {"__init__"},
]
"""dit_sp's packages (and top-level modules), bottom up; a package may import its own layer's others only when
the table below allows it."""

SAME_LAYER = {("zoo", "train"): False, ("train", "zoo"): False, ("inference", "memory"): False}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The dit_sp modules ``name`` imports at module level or in functions (relative imports resolved; those under
    ``if TYPE_CHECKING:`` are for annotations and do not count)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text())
    checks = [b for b in ast.walk(tree) if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)]
    type_only = {id(n) for block in checks for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in type_only:  # annotations only: no import at run time
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            if candidate in modules and candidate != name:
                out.add(candidate)
                break
    return out


def _package_of(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"dit_sp.{package} is in no layer of tests/test_layers.py::LAYERS: add it where it belongs")


def test_packages_import_only_layers_below():
    upward = []
    for module, deps in graph().items():
        mine = _package_of(module)
        for dep in deps:
            theirs = _package_of(dep)
            if theirs == mine or module == "dit_sp" or module.endswith("__init__"):
                continue
            if _layer(theirs) > _layer(mine) or (_layer(theirs) == _layer(mine) and not SAME_LAYER.get((mine, theirs))):
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])

    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_nothing_in_the_library_imports_the_clis():
    offenders = [p for p in PACKAGE.rglob("*.py") if "pipelines" in {n.split(".")[0] for n in _names(p)}]
    assert not offenders, offenders


def _names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("limit", [450])
def test_no_module_holds_many_jobs(limit):
    """A module above about 400 lines holds more than one job: split it."""
    long = {
        p.relative_to(PACKAGE.parent): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > limit
    }
    assert not long, long


if __name__ == "__main__":  # the tree with line counts and the package graph, for a reader
    modules = _modules()
    edges = graph()
    for name in sorted(modules):
        print(f"{len(modules[name].read_text().splitlines()):5d}  {name}")
    packages: dict[str, set[str]] = {}
    for module, deps in edges.items():
        packages.setdefault(_package_of(module), set()).update(_package_of(d) for d in deps)
    print()
    for package in sorted(packages, key=_layer):
        print(f"{package:10s} -> {', '.join(sorted(packages[package] - {package})) or '-'}")
