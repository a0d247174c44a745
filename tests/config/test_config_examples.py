"""The shipped example configs stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_swarm.config import load_config

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def test_the_four_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"local-stub.yaml", "local-vllm.yaml", "slurm.yaml", "lepton.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_parses(path: Path) -> None:
    cfg = load_config(path, environ={}, use_defaults_file=False)
    assert cfg.name and cfg.redacted()["api_key"] is None
