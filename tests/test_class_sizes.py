"""No class of rl_otel defines more than 24 methods (issue 40): past that a class holds several concerns, which
belong in classes or functions of their own. Counted from the source (an AST scan of every module): the functions
defined directly in a class body, properties and dunders included, inherited ones not."""

from __future__ import annotations

import ast
from pathlib import Path

import rl_otel

PACKAGE = Path(rl_otel.__file__).resolve().parent
MAX_METHODS = 24

# Classes allowed over the limit while they are being split, as "path in rl_otel/::class" (none now: issue 40 split
# the last three); a pending class already within the limit fails test_pending_classes_are_still_over_the_limit, so
# that its exemption goes with it.
_PENDING: set[str] = set()


def _class_sizes(tree: ast.AST) -> dict[str, int]:
    """Methods of each class in a module (nested classes too, each counted on its own), by class name."""
    sizes: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            n = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body)
            sizes[node.name] = max(n, sizes.get(node.name, 0))  # two classes of one name: the larger counts
    return sizes


def _package_sizes(root: Path = PACKAGE) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for name, n in _class_sizes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))).items():
            sizes[f"{module}::{name}"] = n
    return sizes


def test_the_count_includes_properties_and_dunders_and_skips_nested_functions():
    tree = ast.parse("class A:\n"
                     "    x = 1\n"
                     "    def __init__(self): pass\n"
                     "    @property\n"
                     "    def p(self):\n"
                     "        def inner(): pass\n"
                     "    async def a(self): pass\n"
                     "    class B:\n"
                     "        def b(self): pass\n")
    assert _class_sizes(tree) == {"A": 3, "B": 1}


def test_no_class_has_more_than_24_methods():
    sizes = _package_sizes()
    assert len(sizes) > 100  # the scan found the package's classes
    over = {key: n for key, n in sizes.items() if n > MAX_METHODS and key not in _PENDING}
    assert not over, "classes over {} methods (split them along their concerns): {}".format(
        MAX_METHODS, "; ".join(f"{key.split('::')[1]} in rl_otel/{key.split('::')[0]}: {n} methods"
                               for key, n in sorted(over.items())))


def test_pending_classes_are_still_over_the_limit():
    """An exemption lasts as long as the class is too large: once it is split, it leaves _PENDING."""
    sizes = _package_sizes()
    done = {key: sizes.get(key) for key in _PENDING if sizes.get(key, 0) <= MAX_METHODS}
    assert not done, f"remove from _PENDING (gone, or within {MAX_METHODS} methods now): {done}"
