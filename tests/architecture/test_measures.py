"""``scripts/measures.py`` counts what CONTRIBUTING.md quotes: its circle finder finds a planted circle and
the lazy import that hides it, and the table of backends (with the config layer) is in no circle."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measures.py"


def _measures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("measures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["measures"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_planted_circle_and_its_lazy_import_are_found() -> None:
    m = _measures()
    edges = [m.Import("a", "b", False, 1), m.Import("b", "c", False, 1), m.Import("c", "a", True, 9)]
    edges.append(m.Import("c", "d", False, 2))
    groups = m.circles(edges)
    assert groups == [["a", "b", "c"]]
    assert m.lazy_breaks(edges, groups) == [m.Import("c", "a", True, 9)]


def test_the_table_of_backends_and_the_config_layer_are_in_no_circle() -> None:
    m = _measures()
    edges = m.imports()
    assert m.Import("prefect_swarm.config.swarm", "prefect_swarm.backends.registry", False, 13) in edges
    caught = [
        g for g in m.circles(edges) if any(x.startswith(("prefect_swarm.backends", "prefect_swarm.config")) for x in g)
    ]
    assert caught == []
