"""Fixtures of the Slurm backend tests: a factory of swarms that always go down. (The flow tests on
Slurm are in ``tests/prefect``, on the suite's one Prefect stack.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from _slurmkit import LiveSwarm

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingHandle


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
