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
- ``monkeypatch.setattr on prefect_swarm``: ``monkeypatch.setattr`` on a module, class or object of
  the product (fault injection belongs in constructor arguments or settings), as ``scripts/measures.py``
  finds them (:func:`measures.setattr_patches`).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

from measures import setattr_patches  # this folder's: one rule for what a patch of the product is

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


def measure_file(path: Path, rel: str) -> Counter[str]:
    """The counts of one file."""
    source = path.read_text()
    tree = ast.parse(source)
    c: Counter[str] = Counter()
    patches = setattr_patches(source)
    c["monkeypatch.setattr (all)"] = len(patches)
    c["monkeypatch.setattr on prefect_swarm"] = sum(1 for *_, whose in patches if whose == "product")
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
        "monkeypatch.setattr on prefect_swarm",
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
