"""docs/architecture.md's module list is the package: its "The modules" section names every module of rl_otel by
its path under ``rl_otel/`` in backticks, and every ``.py`` path the page mentions anywhere is a file that exists.

A module is every ``.py`` file under ``rl_otel/``, except an ``__init__.py`` holding nothing but its docstring (a
package with no code of its own; its directory's line says what it is for)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rl_otel"
DOC = REPO / "docs" / "architecture.md"
SECTION = "## The modules"
_PATH = re.compile(r"`([\w./-]+\.py)`")


def modules(package: Path = PACKAGE) -> set[str]:
    """Every module's path relative to ``package`` (posix), docstring-only ``__init__.py`` files left out."""
    found = set()
    for path in package.rglob("*.py"):
        if path.name == "__init__.py":
            body = ast.parse(path.read_text(encoding="utf-8")).body
            if all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body):
                continue
        found.add(path.relative_to(package).as_posix())
    return found


def section(text: str) -> tuple[int, str]:
    """The first line number (1-based) and the text of the "The modules" section."""
    start = text.index(f"\n{SECTION}\n") + 1
    end = text.find("\n## ", start + len(SECTION))
    return text.count("\n", 0, start) + 1, text[start:None if end < 0 else end]


def problems(doc: str, package: Path = PACKAGE, repo: Path = REPO) -> list[str]:
    """What to add to or remove from ``doc``, one sentence each (empty when it lists the package exactly)."""
    first, listed_text = section(doc)
    listed: dict[str, int] = {}
    for offset, line in enumerate(listed_text.splitlines()):
        for path in _PATH.findall(line):
            if not path.startswith(("tests/", "benchmarks/")):
                listed.setdefault(path, first + offset)
    have = modules(package)
    out = [f"docs/architecture.md, section {SECTION!r}: add a line for `{m}` (\"- `{m}`: what it does.\", in its "
           f"package's group)" for m in sorted(have - set(listed))]
    out += [f"docs/architecture.md:{line}: `{p}` is no module under rl_otel/ (renamed or removed?): write its "
            f"path under rl_otel/ or remove it" for p, line in sorted(listed.items()) if p not in have]
    # elsewhere on the page a path may be short (`pipeline/records.py`, `otel_env.py`): the tail of a file's path
    files = [f"/{p.relative_to(repo).as_posix()}" for d in ("rl_otel", "tests", "benchmarks", "scripts")
             for p in (repo / d).rglob("*.py")] + [f"/rl_otel/{m}" for m in have]
    for number, line in enumerate(doc.splitlines(), 1):
        for path in _PATH.findall(line):
            if not any(f.endswith(f"/{path}") for f in files):
                out.append(f"docs/architecture.md:{number}: `{path}` names no file of the repository (renamed or "
                           f"removed?): correct or remove it")
    return out


def test_the_architecture_page_lists_every_module_and_no_other():
    found = problems(DOC.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_check_names_a_missing_module_and_a_stale_path(tmp_path):
    """The check fails, saying what to add and what to remove, on a page that misses a module and names one
    that does not exist (a package of two modules and an empty ``__init__.py``)."""
    package = tmp_path / "rl_otel"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "__init__.py").write_text('"""only a docstring"""\n')
    (package / "kept.py").write_text("X = 1\n")
    (package / "sub" / "new.py").write_text("Y = 2\n")
    page = (f"# x\n\n{SECTION}\n\n- `kept.py`: kept.\n- `sub/old.py`: renamed since.\n\n## Next\n\n"
            "`pipeline/gone.py` elsewhere.\n")
    found = problems(page, package, tmp_path)
    assert any("add a line for `sub/new.py`" in p for p in found), found
    assert any("docs/architecture.md:6: `sub/old.py` is no module" in p for p in found), found
    assert any("`pipeline/gone.py` names no file" in p for p in found), found
    assert not any("sub/__init__.py" in p or "`kept.py`" in p for p in found), found
    fixed = page.replace("sub/old.py", "sub/new.py").replace("`pipeline/gone.py` elsewhere.", "")
    assert problems(fixed, package, tmp_path) == []
