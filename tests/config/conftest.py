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
