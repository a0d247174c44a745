"""A flow's ``swarm`` parameter given as a file: a path the worker cannot read is a user error that says
where it looked and what to pass instead (not the CLI's -c/--config advice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.tasks.swarm import resolve_swarm


def test_a_relative_path_the_worker_lacks_names_its_folder_and_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a worker's temporary folder for the run
    with pytest.raises(ConfigError) as err:
        resolve_swarm("configs/qwen.yaml")
    text = str(err.value)
    assert "configs/qwen.yaml" in text and str(tmp_path) in text and "-c/--config" not in text
    assert "absolute path" in text and "swarm-spec/NAME" in text


def test_an_absolute_path_that_exists_loads(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("name: fromfile\nmodel: m\nreplicas: 1\n")
    assert resolve_swarm(str(cfg)).name == "fromfile"
