"""The package's shape stays reviewable (issue 43, items 2 and 4; STYLE.md, "Code" and
"Layout"): no function in `locoexp/` runs longer than 60 lines, the modules the type checker
holds to `strict` exist, no module imports itself through others (no import cycle), and the
packages depend on each other one way, in the layers the architecture names (`LAYERS`).

A function's length is counted from its first decorator (or its `def`) to its last line, so its
signature, docstring, comments, blank lines and nested functions all count: that is what a
reader scrolls through. A nested function counts on its own as well as inside its parent.

An import is every `import` statement of a module, wherever it stands: at module level, inside
a function, or under `TYPE_CHECKING`. A function-local import defers when a module loads (jax
once the config holds, Ray only under `da`), not what depends on what: a cycle hidden in a
function is a cycle (`compose` <-> `preflight` and `model.gemma4` <-> `model.transformer`
were). `from package import name` is an import of `package.name` where that is a module, else
of `package`.
"""

import ast
import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "locoexp"
MAX_FUNCTION_LINES = 60


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length in lines) of every function and method in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found.append((node.name, node.lineno, node.end_lineno - first + 1))
    return found


def test_the_length_counts_decorators_docstring_and_nested_functions():
    source = '@decorator\ndef outer():\n    """Doc."""\n\n    def inner():\n        pass\n'
    assert sorted(function_lengths(source)) == [("inner", 5, 2), ("outer", 2, 6)]


def test_no_function_in_the_package_is_longer_than_60_lines():
    too_long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, line, length in function_lengths(path.read_text())
        if length > MAX_FUNCTION_LINES
    ]
    assert not too_long, "split these functions:\n" + "\n".join(too_long)


def test_every_module_the_type_checker_holds_strict_exists():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = [
        module
        for override in config["overrides"]
        if override.get("disallow_untyped_defs")
        for module in override["module"]
    ]
    assert strict, "pyproject.toml names no strict module for mypy"
    missing = [module for module in strict if importlib.util.find_spec(module) is None]
    assert not missing, f"pyproject.toml holds modules that do not exist to strict: {missing}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, *, package: bool, modules: set[str]) -> set[str]:
    """The names every import statement of `module` imports, wherever it stands (relative
    imports resolved; `package`: the source is an `__init__.py`): `from p import n` imports
    `p.n` where that is one of `modules`, else `p`."""
    here = module.split(".") if package else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                name = f"{base}.{alias.name}"
                names.add(name if name in modules else base)
    return names


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of `sources` (module -> its source and whether it is a package) it
    imports; a name inside a module (`import p.m.function`) counts as its module."""
    graph = {}
    for module, (source, package) in sources.items():
        found = set()
        for name in imported_names(source, module, package=package, modules=set(sources)):
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
        graph[module] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of `graph` with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while not part or part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_sources() -> dict[str, tuple[str, bool]]:
    return {
        module_name(path): (path.read_text(), path.name == "__init__.py")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def top_level(module: str) -> str:
    """The package (or single module) of `locoexp` that `module` belongs to."""
    return module.split(".")[1] if "." in module else module


def test_the_graph_counts_every_import_statement_wherever_it_stands():
    sources = {
        "p": ("", True),
        "p.a": ("def f():\n    from p import b\n", False),
        "p.b": ("from . import c\nfrom .c import thing\n", False),
        "p.c": ("import typing\nif typing.TYPE_CHECKING:\n    import p.a.f\n", False),
    }
    graph = import_graph(sources)
    assert graph == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_no_module_of_the_package_imports_itself_through_others():
    found = cycles(import_graph(package_sources()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


# The layers of the package, lowest first (STYLE.md, "Layout"; DESIGN.md): a package imports its
# own layer and those below, never one above. The parts of a step never import what composes
# them; the planner sizes roles from sub-configs and the layout, never the runtime (placement)
# or the root config; placement composes trainer and rollout into a step and its transports,
# and never reads the root config; the session builds a `RunSpec` from the config and runs it;
# XLA's verdict compiles what the session builds; the start-up checks use all of it; `main`
# alone runs a run. Within a layer, the packages still import each other one way (below).
LAYERS = [
    {"errors"},
    {"layout", "hardware", "network"},  # leaves: who runs where, the chips, a probe
    {"model", "tokenizer", "reward", "algo", "adapter", "dataset", "metrics", "checkpoint"},
    {"trainer", "rollout"},  # the two halves' machinery
    {"planner"},
    {"placement"},
    {"applies", "config", "compose"},  # the root config: which keys apply, the schema, Hydra
    {"analysis"},  # reads the records a run leaves, and the cells of composed experiments
    {"session"},
    {"compiled"},
    {"preflight"},
    {"main"},
]


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph(package_sources()).items():
        graph.setdefault(top_level(module), set()).update(
            top_level(m) for m in imported if top_level(m) != top_level(module)
        )
    return graph


def test_every_package_has_a_layer():
    layered = set().union(*LAYERS)
    assert sum(len(layer) for layer in LAYERS) == len(layered), "a package in two layers"
    unplaced = set(package_graph()) - layered - {"locoexp"}
    assert not unplaced, f"place these in LAYERS: {sorted(unplaced)}"


def test_no_package_imports_one_above_its_layer():
    level = {package: n for n, layer in enumerate(LAYERS) for package in layer}
    upward = [
        f"{package} -> {other}"
        for package, imported in sorted(package_graph().items())
        for other in sorted(imported)
        if package in level and level[other] > level[package]
    ]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_the_packages_import_each_other_one_way():
    found = cycles(package_graph())
    assert not found, "packages that import each other:\n" + "\n".join(map(str, found))


def test_the_generic_loop_and_transport_never_import_the_ray_transport():
    """`placement.ray` holds everything only Ray needs; the session reaches it through its
    table of transports (`session.lifecycle.OPEN_TRANSPORT`)."""
    graph = import_graph(package_sources())
    ray = "locoexp.placement.ray"
    reaching = [
        f"{module} -> {other}"
        for module, imported in sorted(graph.items())
        if module.startswith("locoexp.placement") and not module.startswith(ray)
        for other in sorted(imported)
        if other.startswith(ray)
    ]
    assert not reaching, "\n".join(reaching)


def test_hydra_is_imported_by_the_compose_module_alone():
    importing = [
        module
        for module, (source, package) in package_sources().items()
        if {"hydra", "omegaconf"}
        & {n.split(".")[0] for n in imported_names(source, module, package=package, modules=set())}
    ]
    assert importing == ["locoexp.compose"]
