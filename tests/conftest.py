"""Shared fixtures: an isolated PREFECT_SWARM_HOME per test, and service gates.

Service gates skip locally with the install hint; under PREFECT_SWARM_REQUIRE_SERVICES=1
(``.ci/run``) they fail instead, so CI never passes on skipped integration tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.testing import services

REQUIRE = os.environ.get("PREFECT_SWARM_REQUIRE_SERVICES") == "1"


def gate(reason: str | None) -> None:
    """Skip (locally) or fail (CI) when ``reason`` says a service is missing."""
    if reason is None:
        return
    if REQUIRE:
        pytest.fail(f"required service missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def swarm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own PREFECT_SWARM_HOME (state.db, swarm folders)."""
    home = tmp_path_factory.mktemp("swarm-home")
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(home))
    for key in list(os.environ):
        if key.startswith("PREFECT_SWARM_") and key not in (
            "PREFECT_SWARM_HOME", "PREFECT_SWARM_REQUIRE_SERVICES", "PREFECT_SWARM_VLLM_PYTHON",
            "PREFECT_SWARM_TINY_MODEL", "PREFECT_SWARM_CACHE",
        ):
            monkeypatch.delenv(key)
    return home


@pytest.fixture
def need_vllm() -> None:
    """Gate on the vLLM CPU build and tiny model."""
    gate(services.missing_vllm())


@pytest.fixture
def need_slurm() -> None:
    """Gate on a running single-node Slurm (with sacct) and nginx."""
    gate(services.missing_slurm() or services.missing_nginx())


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
    return services.free_port
