"""How the tests wait: counts read from the source, to compare a tree with another.

    python scripts/test_waits_measure.py            # this checkout's tests/ and prefect_swarm/testing/
    python scripts/test_waits_measure.py ROOT ...   # other checkouts, side by side

A test should wait on what the product writes (a state row, a progress file, a Prefect state, an
event) through ``prefect_swarm.testing.wait_until``, not on the clock. Counted, by reading the code
(nothing is run):

- ``test functions that sleep``: ``def test_*`` whose body (helpers nested in it included) calls
  ``time.sleep``/``asyncio.sleep``;
- ``sleeping loops``: ``for``/``while`` loops whose body calls a sleep (each one is a wait of its own);
- ``deadline loops``: loops whose condition reads the clock (``time.monotonic()``, ``time.time()``,
  a ``deadline``);
- ``wait helpers with a loop of their own``: ``def wait_*``/``_wait_*`` that loop instead of calling
  ``wait_until`` (the one that may: ``prefect_swarm/testing/waiting.py``);
- ``monkeypatch.setattr on module globals``: ``monkeypatch.setattr(module, "name", ...)`` or
  ``monkeypatch.setattr("package.module.name", ...)`` (fault injection belongs in constructor
  arguments or settings).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHERE = ("tests", "prefect_swarm/testing")
THE_WAIT = "prefect_swarm/testing/waiting.py"
SLEEPS = {"sleep"}


def _is_sleep(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr in SLEEPS and isinstance(f.value, ast.Name)) or (
        isinstance(f, ast.Name) and f.id in SLEEPS
    )


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """``node``'s descendants, without those of functions or classes defined in it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _reads_clock(test: ast.AST) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Attribute) and n.attr in ("monotonic", "time", "perf_counter"):
            return True
        if isinstance(n, ast.Name) and "deadline" in n.id.lower():
            return True
    return False


def _module_names(tree: ast.Module) -> set[str]:
    """Names this file binds to a module (``import x.y as m``; ``from pkg import mod`` when mod is one)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                try:
                    found = importlib.util.find_spec(f"{node.module}.{a.name}") is not None
                except (ImportError, ValueError, AttributeError):
                    found = False
                if found:
                    names.add(a.asname or a.name)
    return names


def _is_monkeypatch_setattr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setattr"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "monkeypatch"
        and bool(node.args)
    )


def _patches_module_global(node: ast.AST, modules: set[str]) -> bool:
    if not _is_monkeypatch_setattr(node):
        return False
    target = node.args[0]  # type: ignore[attr-defined]
    if isinstance(target, ast.Constant) and isinstance(target.value, str):
        return "." in target.value  # "package.module.name"
    if isinstance(target, ast.BinOp):  # __name__ + ".NAME"
        return True
    return isinstance(target, (ast.Name, ast.Attribute)) and ast.unparse(target).split(".")[0] in modules


def measure_file(path: Path, rel: str) -> Counter[str]:
    """The counts of one file."""
    tree = ast.parse(path.read_text())
    c: Counter[str] = Counter()
    modules = _module_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("test"):
                c["test functions"] += 1
                if any(_is_sleep(n) for n in ast.walk(node)):
                    c["test functions that sleep"] += 1
            loops = [n for n in _own_nodes(node) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))]
            if node.name.lstrip("_").startswith("wait") and loops and rel != THE_WAIT:
                c["wait helpers with a loop of their own"] += 1
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and rel != THE_WAIT:
            if any(_is_sleep(n) for n in _own_nodes(node)):
                c["sleeping loops"] += 1
            if isinstance(node, ast.While) and _reads_clock(node.test):
                c["deadline loops"] += 1
        if _is_sleep(node):
            c["sleep calls"] += 1
        if _is_monkeypatch_setattr(node):
            c["monkeypatch.setattr (all)"] += 1
        if _patches_module_global(node, modules):
            c["monkeypatch.setattr on module globals"] += 1
    return c


def measure(root: Path = ROOT) -> dict[str, int]:
    """The counts over ``root``'s tests/ and prefect_swarm/testing/."""
    total: Counter[str] = Counter()
    for where in WHERE:
        for path in sorted((root / where).rglob("*.py")):
            total += measure_file(path, path.relative_to(root).as_posix())
    keys = (
        "test functions",
        "test functions that sleep",
        "sleep calls",
        "sleeping loops",
        "deadline loops",
        "wait helpers with a loop of their own",
        "monkeypatch.setattr (all)",
        "monkeypatch.setattr on module globals",
    )
    return {k: total[k] for k in keys}


def main(argv: list[str]) -> None:
    roots = [Path(a) for a in argv] or [ROOT]
    results = [measure(r) for r in roots]
    width = max(len(k) for k in results[0])
    print(f"{'':{width}}  " + "  ".join(f"{r!s:>12}"[-12:] for r in roots))
    for key in results[0]:
        print(f"{key:{width}}  " + "  ".join(f"{res[key]:>12}" for res in results))


if __name__ == "__main__":
    main(sys.argv[1:])
