"""Every entry of the table of backends appears everywhere a backend must: the config union and the
error hints, the blocks and the package's exports, the docs' config reference; and no code outside
``backends/`` switches on a backend's name or config class (it asks the entry)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

import prefect_swarm
from prefect_swarm.backends.entry import load
from prefect_swarm.backends.registry import ENTRIES
from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.backends import BACKEND_TYPES, BackendConfig
from prefect_swarm.exceptions import ConfigError

PACKAGE = Path(prefect_swarm.__file__).parent
REFERENCE = PACKAGE.parent / "docs" / "reference" / "config-fields.md"
KINDS = list(ENTRIES)


def _invalid(backend: dict) -> str:
    from prefect_swarm.config.loader import load_config

    with pytest.raises(ConfigError) as err:
        load_config(overrides={"name": "t", "model": "m", "backend": backend})
    return str(err.value)


def test_the_table_lists_the_four_built_in_backends() -> None:
    assert KINDS == ["local", "slurm", "lepton", "external"] == list(BACKEND_TYPES)


@pytest.mark.parametrize("kind", KINDS)
def test_the_config_union_and_its_error_hints_know_every_entry(kind: str) -> None:
    entry = ENTRIES[kind]
    assert entry.config in typing.get_args(typing.get_args(BackendConfig)[0])
    assert SwarmConfig.model_fields["backend"].description and kind in SwarmConfig.model_fields["backend"].description
    field = next(n for n, i in entry.config.model_fields.items() if n != "type" and i.alias is None and len(n) > 4)
    typo = field[:2] + field[3:]  # one letter dropped
    assert f"Did you mean '{field}'?" in _invalid({"type": kind, typo: 1})
    assert kind in _invalid({"type": "no-such-backend"})


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_has_a_block_exported_by_the_package(kind: str) -> None:
    from prefect_swarm import blocks

    entry = ENTRIES[kind]
    block = blocks.BACKEND_BLOCKS[kind]
    assert block.config_model is entry.config and block.__name__ == entry.block
    assert getattr(blocks, entry.block) is block is getattr(prefect_swarm, entry.block)
    assert entry.block in dir(prefect_swarm) and entry.block in blocks.__all__
    assert block in typing.get_args(blocks.SwarmSpec.model_fields["backend"].annotation)


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_names_its_classes_and_is_in_the_reference(kind: str) -> None:
    entry = ENTRIES[kind]
    assert isinstance(load(entry.serving), type) and isinstance(load(entry.compute), type)
    assert f"\n## {entry.config.__name__}\n" in REFERENCE.read_text()


def _switches(text: str) -> list[str]:
    """A backend's config class in an ``isinstance``, its name compared with ``==``/``!=`` or listed in a
    set, tuple or list."""
    found = []
    for kind, entry in ENTRIES.items():
        found += re.findall(rf"isinstance\([^)]*\b{entry.config.__name__}\b[^)]*\)", text)
        found += re.findall(rf"""(?:==|!=)\s*["']{kind}["']|["']{kind}["']\s*(?:==|!=)""", text)
        found += re.findall(rf"""[{{(\[]\s*["']{kind}["']\s*[,}})\]]""", text)  # a set or list of backends
    return found


def test_no_code_outside_backends_switches_on_a_backend() -> None:
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if (PACKAGE / "backends") not in p.parents]
    found = [f"{p.relative_to(PACKAGE)}: {s}" for p in outside for s in _switches(p.read_text())]
    assert found == [], "ask the backend's entry (prefect_swarm.backends.registry.entry_of) instead"


def test_the_switch_finder_finds_a_switch() -> None:
    planted = 'if cfg.backend.type == "slurm" or isinstance(cfg.backend, LeptonConfig) or "local" != kind:\n'
    assert sorted(_switches(planted)) == ['"local" !=', '== "slurm"', "isinstance(cfg.backend, LeptonConfig)"]
    assert _switches('LB = frozenset({"slurm"})\nif kind in ("external", x):\n') == ['{"slurm"}', '("external",']
