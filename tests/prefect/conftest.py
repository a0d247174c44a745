"""Fixtures for the Prefect tests.

``prefect_stack`` (session): a REAL `prefect server start` on its own port with a temp
PREFECT_HOME, the work pool, the blocks, the deployments of deployments/prefect.yaml, the zombie
automation and a REAL process worker. Stopped worker-first, by PID (process groups). The test
process's Prefect client points at it (``temporary_settings``), so in-process flows and API reads
use the same server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from stack import PrefectStack


@pytest.fixture(scope="session")
def prefect_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:
    """Server + deployments + worker for the whole session."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("prefect-stack")
    stack = PrefectStack(home=root / "prefect-home", swarm_home=root / "swarm-home")
    try:
        stack.start_server()
        stack.deploy()
        stack.start_worker()
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            yield stack
            _flush_api_logs()
    finally:
        stack.stop()


def _flush_api_logs() -> None:
    """Send in-process flows' buffered logs while the server is still up."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)


@pytest.fixture
def prefect_api(prefect_stack: PrefectStack) -> PrefectStack:
    """The stack (explicit name for tests that only talk to the API)."""
    return prefect_stack
