"""Fixtures for config tests: run the real console script as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def cli_argv() -> list[str]:
    """The installed ``prefect-swarm`` script, else ``python -m prefect_swarm.cli.main``."""
    script = Path(sys.executable).with_name("prefect-swarm")
    if script.exists():
        return [str(script)]
    found = shutil.which("prefect-swarm")
    return [found] if found else [sys.executable, "-m", "prefect_swarm.cli.main"]


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``prefect-swarm ARGS`` in a subprocess with this test's environment."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        return subprocess.run(
            [*cli_argv(), *args], capture_output=True, text=True, env=full_env, timeout=timeout
        )

    return run


@pytest.fixture
def stub_swarm_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a config for a local swarm of stub engines on free ports; returns its path."""
    from prefect_swarm.testing.services import free_port_block

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
                "command": [
                    "{python}",
                    "-m",
                    "prefect_swarm.testing.stub_engine",
                    "--host",
                    "{host}",
                    "--port",
                    "{port}",
                    "--model",
                    "{served_model_name}",
                ],
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
    """Skip until the local backend is importable; afterwards stop every swarm the test left."""
    pytest.importorskip("prefect_swarm.backends.serving.local")
    pytest.importorskip("prefect_swarm.backends.compute.local")
    yield
    run_cli("down", "--all", "-y")
