"""The layering rules of the package (CONTRIBUTING.md, "Layout"), checked on the source.

Every import counts, also one inside a function: a lazy import still makes the lower layer depend
on the upper one (and pulls Prefect into a job process that has no Prefect server).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import prefect_swarm

PACKAGE = Path(prefect_swarm.__file__).parent

LAYER = {
    # the ground floor
    "exceptions": 0,
    "settings": 0,
    "paths": 0,
    "redaction": 0,
    "interfaces": 0,
    "config": 0,
    "backends.table": 0,  # the table of backends: each backend's config model and entry (see _area)
    # platforms, the data plane, the state database, processes beside replicas
    "sidecar": 1,
    "state": 1,
    "budget": 1,
    "jobs": 1,
    "backends": 2,
    "testing": 2,
    # the control plane: a swarm, who holds it, jobs on it
    "swarm": 3,
    "holding": 4,
    "launch": 5,
    # the Prefect layer
    "blocks": 6,
    "tasks": 7,
    "flows": 8,
    "batchserver": 8,  # the OpenAI batch service: jobs through launch (or a deployment run), swarms through holding
    "cli": 9,
}
"""An area may import its own layer and the ones below it, never one above."""

PREFECT_FREE = {
    "exceptions",
    "settings",
    "paths",
    "redaction",
    "interfaces",
    "config",
    "sidecar",
    "state",
    "budget",
    "jobs",
    "backends",
    "backends.table",
    "testing",
    "swarm",
    "holding",
    "launch",
}
"""Areas that never import Prefect (the job process and the backends run without it)."""

FORBIDDEN = {"jobs": {"swarm", "state", "launch", "backends"}, "budget": {"jobs", "state", "sidecar"}}
"""Explicit bans beyond the layer order: the data plane knows nothing of swarms or state."""

TABLE = ("entry", "registry")
"""The modules of ``backends/`` that make the table of backends, with each ``backends/<name>/config.py``
(a config model and its entry): the config layer builds the
config union from them, so they sit on its floor and import nothing a backend runs with (its serving
and compute classes are named as strings, imported when a swarm is built)."""


def _area(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "prefect_swarm" or len(parts) < 2:
        return None
    if parts[1] == "backends" and (len(parts) == 2 or parts[2] in TABLE or parts[3:4] == ["config"]):
        return "backends.table"  # the package (names loaded on use), entry.py, registry.py, <name>/config.py
    return parts[1]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((".".join(rel.parts).removesuffix(".__init__"), path))
    return out


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _violations() -> list[str]:
    problems = []
    for module, path in _modules():
        area = _area(module)
        if area is None or (area not in LAYER and area != "__main__"):
            if area is not None and area not in LAYER:
                problems.append(f"{module}: area '{area}' has no layer in LAYER; add it")
            continue
        for imported in sorted(_imports(module, path)):
            if (imported == "prefect" or imported.startswith("prefect.")) and area in PREFECT_FREE:
                problems.append(f"{module} imports {imported} (Prefect) but '{area}' must stay Prefect-free")
            target = _area(imported)
            if target is None or target == area or target not in LAYER:
                continue
            if target in FORBIDDEN.get(area, set()):
                problems.append(f"{module} imports {imported}: '{area}' must not import '{target}'")
            elif LAYER[target] > LAYER[area]:
                problems.append(f"{module} imports {imported}: '{target}' is above '{area}'")
    return problems


def test_every_import_runs_downward() -> None:
    assert _violations() == []


@pytest.mark.parametrize(
    ("area", "line", "expected"),
    [
        ("jobs", "from prefect_swarm.state import StateStore", "must not import 'state'"),
        ("jobs", "from prefect_swarm import swarm", "must not import"),
        ("backends", "import prefect", "Prefect-free"),
        ("state", "from prefect_swarm.tasks.jobs import run_shard", "is above"),
    ],
)
def test_the_checker_catches_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, area: str, line: str, expected: str
) -> None:
    """The rules bite: a planted bad import in a copy of the package is reported."""
    import shutil

    copy = tmp_path / "prefect_swarm"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.png", "templates"))
    (copy / area / "_planted.py").write_text(f"{line}\n")
    monkeypatch.setattr(__name__ + ".PACKAGE", copy)
    assert any(expected in p and "_planted" in p for p in _violations())


LEASE_CALLS = (
    ".put_lease(",
    ".release_lease(",
    ".list_leases(",
    ".leases_of(",
    ".clear_leases(",
    ".claim_swarm(",
    ".release_and_claim_teardown(",
    ".from_state(",
)
"""Who holds a swarm, and turning a record into a Swarm: the state database's lease rows, used only by
the primitives (``swarm.py``) and the one home of holding (``holding.py``)."""

LEASE_HOMES = {"prefect_swarm.state.store", "prefect_swarm.swarm", "prefect_swarm.holding"}


def test_lease_calls_live_in_the_holding_module() -> None:
    outside = [
        f"{module}: {call}"
        for module, path in _modules()
        if module not in LEASE_HOMES
        for call in LEASE_CALLS
        if call in path.read_text()
    ]
    assert outside == [], "hold, release and attach swarms through prefect_swarm.holding.Holding"
