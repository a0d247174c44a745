"""Measures of the tree's shape, as CONTRIBUTING.md ("Measures") quotes them; rerun after a change.

- files touched to add a backend: the "Adding a backend" recipe applied to a copy of the package (the
  toy backend of ``tests/backends/toy``), counting the files added or changed and its test;
- import circles: groups of modules of the package that import each other, through any import that runs
  (at the top of a module or inside a function; ``if TYPE_CHECKING:`` imports do not run);
- lazy imports that break a circle: imports inside a function between two modules of such a group (the
  usual way to keep a circle from failing at import time, and what hides it);
- the largest module and function (lines), with the median and 90th percentile of function lengths;
- test functions (``test_*`` under tests/) that sleep (``time.sleep``/``asyncio.sleep`` in their own body),
  how many of them sleep in a loop, and how many read the clock (``time.monotonic``/``time.time``: a deadline);
- tests that patch the product: ``monkeypatch.setattr`` on a module, class or object of ``prefect_swarm``
  (fault injection goes through constructor arguments or settings instead), beside those on other
  libraries (an event of the platform: a step of the clock) and on a test's own module.

    python scripts/measures.py            # the measures, one a line
    python scripts/measures.py --json     # the same, with every circle, lazy import and sleeping test listed
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "prefect_swarm"
TESTS = REPO / "tests"


# ---------------------------------------------------------------------------------- modules and imports
def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the package (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


@dataclass(frozen=True)
class Import:
    """One import statement's target, and whether it runs inside a function."""

    source: str
    target: str
    lazy: bool
    line: int


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, lazy: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Import statements under ``node`` that run, each with whether it is inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, lazy
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _walk(other, lazy)
        else:
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _walk(child, inner)


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    parts = parts[: len(parts) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def _reexports(path: Path, known: dict[str, Path]) -> dict[str, str]:
    """Name -> module a package's ``__init__`` takes it from (its imports, ``TYPE_CHECKING`` ones
    included: a package that loads its names on first use lists them there)."""
    module = ".".join(path.relative_to(REPO).parent.parts)
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            out.update({alias.asname or alias.name: base for alias in node.names if base in known})
    return out


def imports() -> list[Import]:
    """Every import between two modules of the package that runs (a name taken from a package resolves
    to the module the package takes it from)."""
    known = modules()
    reexports = {m: _reexports(p, known) for m, p in known.items() if p.name == "__init__.py"}
    out = []
    for module, path in known.items():
        for node, lazy in _walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _base(module, path, node)
                targets = [_resolve(base, alias.name, known, reexports) for alias in node.names]
            out += [Import(module, t, lazy, node.lineno) for t in targets if t in known and t != module]
    return list(dict.fromkeys(out))  # one a statement and target (``from m import a, b`` is one import of m)


def _resolve(base: str, name: str, known: dict[str, Path], reexports: dict[str, dict[str, str]]) -> str:
    if f"{base}.{name}" in known:
        return f"{base}.{name}"
    return reexports.get(base, {}).get(name, base)


# ---------------------------------------------------------------------------------- circles
def circles(edges: list[Import]) -> list[list[str]]:
    """Groups of modules that import each other (strongly connected, more than one module), largest first."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups, key=lambda g: (-len(g), g))


def lazy_breaks(edges: list[Import], groups: list[list[str]]) -> list[Import]:
    """Imports inside a function between two modules of one circle."""
    group_of = {m: i for i, g in enumerate(groups) for m in g}
    return [e for e in edges if e.lazy and e.source in group_of and group_of[e.source] == group_of.get(e.target)]


# ---------------------------------------------------------------------------------- sizes
def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def sizes() -> dict[str, object]:
    """The largest module and function of the package, and the spread of function lengths."""
    lines = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    funcs = [
        (f"{m}:{name}", node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for m, p in modules().items()
        for name, node in _functions(ast.parse(p.read_text()))
    ]
    module, module_lines = max(lines.items(), key=lambda kv: kv[1])
    function, function_lines = max(funcs, key=lambda kv: kv[1])
    lengths = sorted(n for _, n in funcs)
    return {
        "package_lines": sum(lines.values()),
        "largest_module": {"module": module, "lines": module_lines},
        "largest_function": {"function": function, "lines": function_lines},
        "functions": len(lengths),
        "function_lines_median": statistics.median(lengths),
        "function_lines_p90": lengths[int(0.9 * (len(lengths) - 1))],
    }


# ---------------------------------------------------------------------------------- tests that sleep
def _calls(node: ast.AST, names: set[str]) -> bool:
    """``node`` calls ``x.NAME(...)`` or ``NAME(...)`` for a NAME in ``names`` (nested functions included)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if (isinstance(f, ast.Attribute) and f.attr in names) or (isinstance(f, ast.Name) and f.id in names):
                return True
    return False


def sleeping_tests() -> dict[str, object]:
    """Test functions, and those that sleep, sleep in a loop, or read the clock; and the other functions
    of tests/ (helpers, fixtures) that sleep."""
    tests, sleep, loop, clock, helpers = [], [], [], [], []
    for path in sorted(TESTS.rglob("*.py")):
        for name, node in _functions(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}::{name}"
            if not name.rpartition(".")[2].startswith("test_"):
                helpers += [where] if _calls(node, {"sleep"}) and "." not in name else []
                continue
            tests.append(where)
            if _calls(node, {"sleep"}):
                sleep.append(where)
            if any(isinstance(n, ast.While | ast.For) and _calls(n, {"sleep"}) for n in ast.walk(node)):
                loop.append(where)
            if _calls(node, {"monotonic", "time"}):
                clock.append(where)
    return {
        "test_functions": len(tests),
        "sleep": sleep,
        "sleep_in_a_loop": loop,
        "read_the_clock": clock,
        "helpers_that_sleep": helpers,
    }


# ---------------------------------------------------------------------------------- patched globals
PATCHERS = {"monkeypatch", "mp"}
"""Names a test gives pytest's MonkeyPatch (the fixture, or ``MonkeyPatch.context() as mp``)."""


def _imported(tree: ast.AST) -> dict[str, str]:
    """Name -> what it was imported from, for every import in the file (in any scope)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _root(node: ast.AST) -> str | None:
    """The name an expression like ``a.b[0].c()`` starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def setattr_patches(source: str) -> list[tuple[int, str, str]]:
    """Every ``monkeypatch.setattr`` of ``source``: (line, its target, whose): ``product`` for a module,
    class or object of prefect_swarm (or one the file does not import: an object of the product, as
    far as anyone reading the test can tell), ``own`` for the test's own module (``__name__``),
    ``library`` for anything imported from elsewhere."""
    tree = ast.parse(source)
    imported = _imported(tree)
    found = []
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if not (isinstance(f, ast.Attribute) and f.attr == "setattr" and isinstance(f.value, ast.Name)):
            continue
        if f.value.id not in PATCHERS or not node.args:  # type: ignore[union-attr]
            continue
        target = node.args[0]  # type: ignore[union-attr]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            origin: str | None = target.value
        elif any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(target)):
            found.append((node.lineno, ast.unparse(target), "own"))
            continue
        else:
            origin = imported.get(_root(target) or "")
        whose = "product" if origin is None or origin.partition(".")[0] == "prefect_swarm" else "library"
        found.append((node.lineno, ast.unparse(target), whose))
    return sorted(found)


def patched_globals() -> dict[str, object]:
    """The ``monkeypatch.setattr`` calls of tests/, by whose target they patch (:func:`setattr_patches`)."""
    out: dict[str, list[str]] = {"product": [], "library": [], "own": []}
    for path in sorted(TESTS.rglob("*.py")):
        for line, target, whose in setattr_patches(path.read_text()):
            out[whose].append(f"{path.relative_to(REPO)}:{line} {target}")
    return {"patched_product": out["product"], "patched_library": out["library"], "patched_own": out["own"]}


# ---------------------------------------------------------------------------------- a new backend
def backend_files() -> list[str]:
    """The files the "Adding a backend" recipe touches (the toy backend, added to a copy of the package)."""
    sys.path.insert(0, str(TESTS / "backends"))
    from toy_recipe import files_touched

    with tempfile.TemporaryDirectory() as scratch:
        return files_touched(PACKAGE, Path(scratch))


# ---------------------------------------------------------------------------------- report
def measure() -> dict[str, object]:
    """Every measure, with what it counted."""
    edges = imports()
    groups = circles(edges)
    lazy = lazy_breaks(edges, groups)
    return {
        "files_to_add_a_backend": backend_files(),
        "import_circles": [" <-> ".join(g) for g in groups],
        "lazy_imports_breaking_a_circle": [f"{e.source}:{e.line} imports {e.target}" for e in lazy],
        **sizes(),
        **sleeping_tests(),
        **patched_globals(),
    }


def lines(m: dict[str, object]) -> list[str]:
    """The measures, one a line, as CONTRIBUTING.md quotes them."""
    big, fn = m["largest_module"], m["largest_function"]
    return [
        f"files touched to add a backend: {len(m['files_to_add_a_backend'])}",  # type: ignore[arg-type]
        f"import circles: {len(m['import_circles'])}",  # type: ignore[arg-type]
        f"lazy imports that break a circle: {len(m['lazy_imports_breaking_a_circle'])}",  # type: ignore[arg-type]
        f"largest module: {big['module']} ({big['lines']} lines; the package: {m['package_lines']})",  # type: ignore[index]
        f"largest function: {fn['function']} ({fn['lines']} lines; of {m['functions']} functions, "  # type: ignore[index]
        f"median {m['function_lines_median']:g}, p90 {m['function_lines_p90']})",
        f"test functions that sleep: {len(m['sleep'])} of {m['test_functions']} "  # type: ignore[arg-type]
        f"({len(m['sleep_in_a_loop'])} in a loop); that read the clock: {len(m['read_the_clock'])}; "  # type: ignore[arg-type]
        f"other functions of tests/ that sleep: {len(m['helpers_that_sleep'])}",  # type: ignore[arg-type]
        f"monkeypatch.setattr on prefect_swarm in tests: {len(m['patched_product'])} "  # type: ignore[arg-type]
        f"(on other libraries: {len(m['patched_library'])}; on a test's own module: {len(m['patched_own'])})",  # type: ignore[arg-type]
    ]


def main() -> None:
    """Print the measures (``--json``: with everything they counted)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print every measure with what it counted, as JSON")
    m = measure()
    if parser.parse_args().json:
        print(json.dumps(m, indent=1))
    else:
        print("\n".join(lines(m)))


if __name__ == "__main__":
    main()
