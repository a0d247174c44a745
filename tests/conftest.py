"""Shared fixtures: an isolated PREFECT_SWARM_HOME per test, and service gates.

Service gates skip locally with the install hint; under PREFECT_SWARM_REQUIRE_SERVICES=1
(``.ci/run``) they fail instead, so CI never passes on skipped integration tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import services

from prefect_swarm.testing import free_port as free_port_fn

gate = services.gate


def _xdist_group(item: pytest.Item) -> str | None:
    """Tests that share one service run one after another on one worker under ``pytest -n``: every
    test that submits to the single-node Slurm (its 4 GPUs; the leak check of ``need_slurm`` reads
    the whole queue), the Prefect server tests (one server per worker), the vLLM CPU engines
    (each wants every core). Everything else is spread over the workers."""
    marks = {m.name for m in item.iter_markers()}
    if marks & {"slurm", "slurm_multinode"} or "need_slurm" in item.fixturenames or "[slurm]" in item.nodeid:
        return "slurm"
    if "prefect_server" in marks:
        return "prefect"
    if "vllm" in marks:
        return "vllm"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = _xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def swarm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own PREFECT_SWARM_HOME (state.db, swarm folders)."""
    home = tmp_path_factory.mktemp("swarm-home")
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(home))
    for key in list(os.environ):
        if key.startswith("PREFECT_SWARM_") and key not in (
            "PREFECT_SWARM_HOME",
            "PREFECT_SWARM_REQUIRE_SERVICES",
            "PREFECT_SWARM_VLLM_PYTHON",
            "PREFECT_SWARM_TINY_MODEL",
            "PREFECT_SWARM_CACHE",
        ):
            monkeypatch.delenv(key)
    return home


@pytest.fixture
def need_vllm() -> None:
    """Gate on the vLLM CPU build and tiny model."""
    gate(services.missing_vllm())


@pytest.fixture
def need_slurm() -> Iterator[None]:
    """Gate on a running single-node Slurm (with sacct) and nginx; after the test, every Slurm job
    it submitted must have left the queue (a leak holds GPUs that later tests then wait for)."""
    gate(services.missing_slurm() or services.missing_nginx())
    before = services.slurm_job_ids()
    yield
    leaked = services.slurm_jobs_left(before, wait_s=30)
    if leaked:
        subprocess.run(["scancel", *leaked], check=False)
        pytest.fail(f"the test left Slurm jobs in the queue (now cancelled): {' '.join(leaked)}")


@pytest.fixture
def need_nginx() -> None:
    """Gate on the nginx binary."""
    gate(services.missing_nginx())


@pytest.fixture
def need_lepton_sdk() -> None:
    """Gate on the leptonai SDK."""
    gate(services.missing_lepton_sdk())


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Call to get a free loopback port."""
    return free_port_fn


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

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=full_env, timeout=timeout)

    return run
