"""The package's shape stays reviewable (issue 43, item 4; STYLE.md, "Code"): no function in
`locoexp/` runs longer than 60 lines, and the modules the type checker holds to `strict` exist.

A function's length is counted from its first decorator (or its `def`) to its last line, so its
signature, docstring, comments, blank lines and nested functions all count: that is what a
reader scrolls through. A nested function counts on its own as well as inside its parent.
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
