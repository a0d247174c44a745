"""A backend added by CONTRIBUTING.md's recipe (the toy in ``toy/``, copied into a copy of the package and
listed in the table) is a backend everywhere: its config validates through the CLI, a typo in it gets a
"Did you mean", an unknown type lists it, and it has a Prefect block, exported by the package, that
round-trips a swarm config. And the recipe touches at most five files, its test included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toy_recipe import add_toy, copy_package, files_touched

import prefect_swarm

PACKAGE = Path(prefect_swarm.__file__).parent

CHILD = r"""
import json, sys
from typer.testing import CliRunner

import prefect_swarm
from prefect_swarm.blocks import BACKEND_BLOCKS, SwarmSpec
from prefect_swarm.cli.main import app
from prefect_swarm.config import load_config

def cli(*args):
    res = CliRunner().invoke(app, list(args))
    return {"code": res.exit_code, "out": res.output}

cfg = load_config("toy.yaml")
block = BACKEND_BLOCKS["toy"]
print(json.dumps({
    "valid": cli("validate", "-c", "toy.yaml", "-o", "json"),
    "typo": cli("validate", "-c", "typo.yaml"),
    "unknown": cli("validate", "-c", "unknown.yaml"),
    "block": block.__name__,
    "block_type": block.get_block_type_name(),
    "exported": prefect_swarm.ToyBackend is block and "ToyBackend" in dir(prefect_swarm),
    "round_trip": SwarmSpec.from_config(cfg).to_config() == cfg,
    "schema": "greeting" in block.model_json_schema()["properties"],
}))
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What a process importing the package with the toy backend added reports (one child process)."""
    root = tmp_path_factory.mktemp("toy")
    add_toy(copy_package(PACKAGE, root))
    swarm = "name: toy-swarm\nmodel: tiny\nengine: {kind: command, command: ['true']}\nbackend:\n  type: "
    (root / "toy.yaml").write_text(swarm + "toy\n  greeting: hi\n")
    (root / "typo.yaml").write_text(swarm + "toy\n  greting: hi\n")
    (root / "unknown.yaml").write_text(swarm + "tyo\n")
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_toy_backend_validates_through_the_cli(toy: dict) -> None:
    assert toy["valid"]["code"] == 0, toy["valid"]["out"]
    shown = json.loads(toy["valid"]["out"])
    assert (shown["backend"], shown["config"]["backend"]["greeting"]) == ("toy", "hi")
    assert shown["capabilities"]["backend"] == "local"  # the toy serves as the local backend does


def test_a_typo_in_a_toy_config_gets_the_hint(toy: dict) -> None:
    assert toy["typo"]["code"] != 0
    assert "backend.greting: unknown key 'greting'. Did you mean 'greeting'?" in toy["typo"]["out"]


def test_an_unknown_backend_type_lists_the_toy(toy: dict) -> None:
    assert toy["unknown"]["code"] != 0
    listed = "backend type 'tyo' is not valid; choose one of local, slurm, lepton, external, toy."
    assert listed in toy["unknown"]["out"]


def test_the_toy_has_an_exported_block(toy: dict) -> None:
    assert (toy["block"], toy["block_type"], toy["exported"]) == ("ToyBackend", "Swarm Toy Backend", True)
    assert toy["round_trip"] and toy["schema"]


def test_adding_a_backend_touches_at_most_five_files(tmp_path: Path) -> None:
    touched = files_touched(PACKAGE, tmp_path)
    assert touched == [
        "prefect_swarm/backends/toy/__init__.py",
        "prefect_swarm/backends/toy/backend.py",
        "prefect_swarm/backends/toy/config.py",
        "prefect_swarm/backends/registry.py",
        "tests/backends/test_toy_backend.py",
    ]
    assert len(touched) <= 5
