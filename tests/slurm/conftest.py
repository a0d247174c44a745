"""Fixtures of the Slurm backend tests: a factory of swarms that always go down, and (for the
flow tests) the real Prefect server + process worker of ``tests/prefect/stack.py``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _slurmkit import LiveSwarm

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingHandle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "prefect"))
from stack import PrefectStack  # tests/prefect/stack.py: one stack class for both areas


@pytest.fixture
def slurm_swarm(need_slurm: None) -> Iterator[Callable[..., LiveSwarm]]:
    """Factory: ``slurm_swarm(cfg)`` -> LiveSwarm; every swarm made is deleted after the test."""
    made: list[LiveSwarm] = []

    def make(cfg: SwarmConfig) -> LiveSwarm:
        swarm = LiveSwarm(cfg)
        made.append(swarm)
        return swarm

    yield make
    for swarm in made:
        swarm.down()
        if swarm.handle is None:  # submitted nothing we know of: still sweep by name
            swarm.serving.delete(ServingHandle(swarm.cfg.name, "slurm", meta={"replicas": swarm.cfg.replicas}))


@pytest.fixture(scope="session")
def slurm_prefect_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:
    """A real `prefect server start` + deployments + process worker, for the Slurm flow tests.

    The same stack as ``tests/prefect``'s ``prefect_stack`` (own server: fixtures do not cross
    area folders); started only when a test here asks for it. Stopped worker first, by PID.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("slurm-prefect-stack")
    stack = PrefectStack(home=root / "prefect-home", swarm_home=root / "swarm-home")
    try:
        stack.start_server()
        stack.deploy()
        stack.start_worker()
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            yield stack
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=5)
    finally:
        stack.stop()
