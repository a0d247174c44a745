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
    "sizing": 2,  # a job's shards and in-flight cap from its swarm's config (the job spec and the swarm config)
    "pilot": 2,  # a short pilot run on a sample of the input, sized like the job
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
    "sizing",
    "pilot",
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


JOB_ROOMS = {
    # what a row becomes: the spec, the job API and the pieces it is built from
    "jobs.rows.storage": ("locations", 0),  # local and object-store locations: nothing of a job
    "jobs.spec": ("definition", 1),
    "jobs.columns": ("definition", 1),
    "jobs.api": ("definition", 1),
    "jobs.structured": ("definition", 1),
    "jobs.template": ("definition", 1),
    "jobs.images": ("definition", 1),
    # where rows come from and go to
    "jobs.rows": ("rows", 2),
    # the checkpoint: the ledger, the fingerprint, the plan
    "jobs.checkpoint": ("checkpoint", 3),
    # how rows reach replicas; and the commit, which merges the checkpoint into the output
    "jobs.dispatch": ("dispatch", 4),
    "jobs.rows.commit": ("commit", 4),
    # the job kinds and the job process
    "jobs": ("kinds", 5),
}
"""The rooms of ``jobs/`` (CONTRIBUTING.md, "Layout"): a module may import its own room and the lower
ranks, never a higher rank nor another room of its rank (the checkpoint never imports the request loop,
the request loop never imports the commit). The longest prefix of a module's name decides its room."""


def _room(module: str) -> tuple[str, int] | None:
    name = module.removeprefix("prefect_swarm.")
    if name == module or not (name == "jobs" or name.startswith("jobs.")):
        return None
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in JOB_ROOMS:
            return JOB_ROOMS[".".join(parts[:n])]
    return None


def _known(name: str, modules: set[str]) -> str | None:
    """The package module ``name`` names (``from package import module`` gives ``package.module``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _room_violations() -> list[str]:
    modules = dict(_modules())
    problems = []
    for module, path in modules.items():
        room = _room(module)
        if room is None:
            continue
        targets = {t for n in _imports(module, path) if (t := _known(n, set(modules)))}
        # ``from package import module``: the module counts, not its package (an ``__init__`` of a docstring)
        targets -= {t for t in targets if any(u.startswith(t + ".") for u in targets)}
        for target in sorted(targets):
            other = _room(target)
            if other is None or other == room or target == module:
                continue
            if other[1] > room[1]:
                problems.append(f"{module} imports {target}: room '{other[0]}' is above '{room[0]}'")
            elif other[1] == room[1]:
                problems.append(f"{module} imports {target}: rooms '{room[0]}' and '{other[0]}' are side by side")
    return problems


def _job_circles() -> list[list[str]]:
    """Groups of ``jobs`` modules importing each other through imports that run (not ``if TYPE_CHECKING:``)."""
    modules = {m: p for m, p in _modules() if _room(m) is not None}
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for n in ast.walk(stmt)
        }
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            found.update(t for n in names if (t := _known(n, set(modules))) and t != module)
        edges[module] = found

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {m: reach(m) for m in edges}
    groups = {frozenset(m2 for m2 in reached[m] if m in reached[m2]) | {m} for m in edges if m in reached[m]}
    return sorted(sorted(g) for g in groups)


def test_the_rooms_of_jobs_import_downward_and_in_no_circle() -> None:
    assert _room_violations() == []
    assert _job_circles() == []


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the package that the checks of this module read instead (plant a bad import in it)."""
    import shutil

    copy = tmp_path / "prefect_swarm"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.png", "templates"))
    monkeypatch.setattr(__name__ + ".PACKAGE", copy)
    return copy


@pytest.mark.parametrize(
    ("room", "line", "expected"),
    [
        (
            "jobs/checkpoint",
            "from prefect_swarm.jobs.dispatch.runner import Runner",
            "'dispatch' is above 'checkpoint'",
        ),
        ("jobs/rows", "from prefect_swarm.jobs.checkpoint import ledger", "'checkpoint' is above 'rows'"),
        ("jobs/dispatch", "from prefect_swarm.jobs.rows.commit import commit_output", "side by side"),
    ],
)
def test_the_room_check_catches_an_upward_import(planted: Path, room: str, line: str, expected: str) -> None:
    (planted / room / "_planted.py").write_text(f"{line}\n")
    assert any(expected in p and "_planted" in p for p in _room_violations())


def test_the_circle_check_catches_a_circle_in_jobs(planted: Path) -> None:
    """A lazy import (inside a function) from the ledger back to the runner closes a circle through
    the runner's import of the ledger: reported, though nothing fails at import time."""
    ledger = planted / "jobs" / "checkpoint" / "ledger.py"
    ledger.write_text(
        ledger.read_text() + "\n\ndef _planted() -> None:\n    from prefect_swarm.jobs.dispatch import runner\n"
    )
    assert any(
        "prefect_swarm.jobs.checkpoint.ledger" in g and "prefect_swarm.jobs.dispatch.runner" in g
        for g in _job_circles()
    )


@pytest.mark.parametrize(
    ("area", "line", "expected"),
    [
        ("jobs", "from prefect_swarm.state import StateStore", "must not import 'state'"),
        ("jobs", "from prefect_swarm import swarm", "must not import"),
        ("backends", "import prefect", "Prefect-free"),
        ("state", "from prefect_swarm.tasks.jobs import run_shard", "is above"),
    ],
)
def test_the_checker_catches_a_violation(planted: Path, area: str, line: str, expected: str) -> None:
    """The rules bite: a planted bad import in a copy of the package is reported."""
    (planted / area / "_planted.py").write_text(f"{line}\n")
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
