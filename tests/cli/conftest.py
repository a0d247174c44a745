"""Fixtures for config tests: run the real console script as a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.testing.stub_engine import engine_command


@pytest.fixture
def stub_swarm_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a config for a local swarm of stub engines on free ports; returns its path."""
    from prefect_swarm.testing import free_port_block

    def make(name: str = "stubby", replicas: int = 2, **extra: object) -> Path:
        import yaml

        data = {
            "name": name,
            "model": "stub-model",
            "replicas": replicas,
            "port": free_port_block(replicas),
            "gpus_per_replica": 0,
            "ready_timeout_s": 60,
            "engine": {
                "kind": "command",
                "command": engine_command(),
                "startup_timeout_s": 60,
            },
            "backend": {"type": "local"},
            **extra,
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return make


@pytest.fixture
def local_backend(run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> object:
    """Stop every swarm the test left."""
    yield
    run_cli("down", "--all", "-y")
