"""The generated reference pages are current, and the reference lists public objects only.

``scripts/gen_reference.py`` writes the CLI and config-field pages from the code: a help text or a
field description changed without running it fails here, naming the page. The docstring pages list
each object they document (``::: package.module.object``): a whole module would bring its helpers in.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import gen_reference  # noqa: E402


def test_generated_reference_pages_are_current() -> None:
    stale = gen_reference.stale()
    assert not stale, f"stale: {[str(p.relative_to(REPO)) for p in stale]}; run python scripts/gen_reference.py"


def test_config_reference_has_every_field_with_type_default_and_description() -> None:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.config.backends import SlurmConfig

    page = gen_reference.CONFIG_PAGE.read_text()
    for model in (SwarmConfig, SlurmConfig):
        for name, field in model.model_fields.items():
            row = next((x for x in page.splitlines() if x.startswith(f"| `{field.alias or name}` |")), None)
            assert row is not None, f"{model.__name__}.{name} is not in the config reference"
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            assert len(cells) == 4 and all(cells), row  # field, type, default, description


def test_cli_reference_has_every_command() -> None:
    page = gen_reference.CLI_PAGE.read_text()
    for cmd in ("up", "down", "status", "job submit", "job status", "job retry", "automations install", "db prune"):
        assert f"## `{cmd}`" in page, cmd


def test_the_reference_lists_objects_not_modules_and_nothing_private() -> None:
    listed = [
        (page.name, m)
        for page in sorted((REPO / "docs" / "reference").glob("*.md"))
        for m in re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.M)
    ]
    assert listed
    modules = [(page, name) for page, name in listed if _find_spec(name) is not None]
    assert not modules, f"list the public objects, not the module: {modules}"
    private = [(page, name) for page, name in listed if any(part.startswith("_") for part in name.split("."))]
    assert not private, private


def _find_spec(name: str) -> object:
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


def test_settings_reference_has_every_variable_with_type_default_and_description() -> None:
    from prefect_swarm.interfaces.jobenv import PROTOCOL
    from prefect_swarm.settings import ENV_PREFIX, Settings

    knobs, handed_on = gen_reference.SETTINGS_PAGE.read_text().split("## Set by prefect-swarm")
    rows = {r.split(" | ")[0].strip("| `"): r for r in knobs.splitlines()}
    for name in Settings.model_fields:
        row = rows.get(ENV_PREFIX + name.upper())
        assert row is not None, f"{ENV_PREFIX}{name.upper()} is not in the settings reference"
        assert len([c for c in row.strip("|").split(" | ") if c.strip()]) == 4, row
    assert all(f"| `{name}` |" in handed_on for name in PROTOCOL)
