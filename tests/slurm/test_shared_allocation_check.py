"""``backend.share_allocation_of`` is refused before anything is submitted when the swarm it names cannot
hold this one's replicas (render.check_shared_allocation, which validate and up call): the host's
record and config are what `up` leaves in its folder, written here without a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefect_swarm.backends.slurm import render
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.paths import SwarmPaths


def _cfg(run_dir: Path, name: str, **fields: Any) -> SwarmConfig:
    backend = {"type": "slurm", "run_dir": str(run_dir), **fields.pop("backend", {})}
    engine = {"kind": "command", "command": ["x"], "sleep_mode": True, **fields.pop("engine", {})}
    data = {"name": name, "model": "m", "replicas": 2, "gpus_per_replica": 1, "engine": engine, "backend": backend}
    return SwarmConfig.model_validate({**data, **fields})


def _host(run_dir: Path, tasks: int = 2, per_task: int = 1, **fields: Any) -> SwarmConfig:
    """A host swarm 'gen' as `up` leaves it: its redacted config and its Slurm record."""
    cfg = _cfg(run_dir, "gen", **fields)
    paths = SwarmPaths.of("gen", str(run_dir)).ensure()
    paths.config.write_text(yaml.safe_dump(cfg.redacted(), sort_keys=False))
    paths.slurm_record.write_text(json.dumps({"array_tasks": tasks, "per_task": per_task}))
    return cfg


def _guest(run_dir: Path, name: str = "judge", **fields: Any) -> SwarmConfig:
    backend = {"share_allocation_of": "gen", **fields.pop("backend", {})}
    return _cfg(run_dir, name, backend=backend, **fields)


def test_a_host_that_can_hold_the_guest_is_accepted(tmp_path: Path) -> None:
    _host(tmp_path)
    render.check_shared_allocation(_guest(tmp_path))
    options = render.replicas_options(_guest(tmp_path), SwarmPaths.of("judge", str(tmp_path)))
    assert "--cpus-per-task=1" in options and not [o for o in options if o.startswith(("--gres", "--mem"))]
    script = render.render_replicas(_guest(tmp_path), SwarmPaths.of("judge", str(tmp_path)))
    assert "srun --jobid=" in script and "--overlap" in script and "psw-gen-replicas" in script


@pytest.mark.parametrize(
    ("host", "guest", "refusal"),
    [
        (None, {}, "no Slurm swarm of that name is up"),
        ({"tasks": 0}, {}, "no Slurm swarm of that name is up"),
        ({}, {"name": "gen"}, "names this swarm itself"),
        ({}, {"engine": {"sleep_mode": False}}, r"this one needs engine\.sleep_mode"),
        ({"engine": {"sleep_mode": False}}, {}, r"runs without engine\.sleep_mode"),
        ({"backend": {"share_allocation_of": "other"}}, {}, "not a Slurm swarm with an allocation of its own"),
        ({"tasks": 1}, {}, "runs 1 task"),
        ({}, {"replicas": 2, "replicas_per_node": 2, "gpus_per_node": 2}, "needs 1 of 2"),
        ({}, {"gpus_per_replica": 2}, "holds 1 GPU"),
        ({}, {"backend": {"container": {"runtime": "pyxis", "image": "img"}}}, "pyxis"),
    ],
)
def test_a_host_that_cannot_is_refused(
    tmp_path: Path, host: dict[str, Any] | None, guest: dict[str, Any], refusal: str
) -> None:
    if host is not None:
        _host(tmp_path, **host)
    cfg = _guest(tmp_path, **guest)
    with pytest.raises(ConfigError, match=refusal):
        render.check_shared_allocation(cfg)
