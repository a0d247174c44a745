"""Holding has one home: a :class:`~prefect_swarm.holding.Holding` is made only by
:func:`~prefect_swarm.holding.default_holding` (in ``prefect_swarm/holding.py``), so every holder of a
swarm gets the Prefect layer's word on flow runs and the blocks' secrets when Prefect is in play, and
the same judgement of who is gone when it is not.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import prefect_swarm

PACKAGE = Path(prefect_swarm.__file__).parent
HOME = PACKAGE / "holding.py"
MEASURES = Path(__file__).resolve().parents[2] / "scripts" / "measures.py"


def _constructions(source: str) -> list[int]:
    """Lines of ``source`` that call ``Holding(...)`` (by its name or as an attribute of a module)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Name) and func.id == "Holding") or (
            isinstance(func, ast.Attribute) and func.attr == "Holding"
        ):
            lines.append(node.lineno)
    return lines


def test_holding_is_made_only_by_its_factory() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME
        for line in _constructions(path.read_text())
    ]
    assert found == [], "get a Holding from prefect_swarm.holding.default_holding(), not Holding(...)"


def test_the_factory_is_in_the_home_and_the_check_sees_a_construction() -> None:
    assert _constructions(HOME.read_text()), "default_holding no longer builds the Holding in holding.py"
    assert _constructions("from prefect_swarm import holding\nh = holding.Holding(store)\n") == [2]
    assert _constructions("x = Holding()\ny = default_holding()\n") == [1]


def test_holding_the_swarm_and_the_prefect_layer_around_them_are_in_no_circle() -> None:
    """Holding registers with no import back up (the Prefect layer imports it, never the reverse), the
    swarm does not import holding, and the reaper and the swarm tasks stay out of each other's way."""
    spec = importlib.util.spec_from_file_location("measures", MEASURES)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    sys.modules["measures"] = m  # its dataclasses look their module up there
    spec.loader.exec_module(m)
    edges = m.imports()
    assert any(x.source == "prefect_swarm.tasks.word" and x.target == "prefect_swarm.holding" for x in edges)
    mine = (
        "prefect_swarm.holding",
        "prefect_swarm.swarm",
        "prefect_swarm.state",
        "prefect_swarm.tasks",
        "prefect_swarm.cli",
    )
    assert [g for g in m.circles(edges) if any(x.startswith(mine) for x in g)] == []
