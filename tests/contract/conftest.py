"""Fixtures of the contract suite: one parametrisation per backend in ``contract_kit.FACTORIES``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from contract_kit import FACTORIES, BackendFactory

from prefect_swarm.swarm import Swarm


@pytest.fixture(params=[pytest.param(f, id=n, marks=f.marks) for n, f in FACTORIES.items()])
def factory(request: pytest.FixtureRequest) -> BackendFactory:
    """One backend factory per parametrisation."""
    fac: BackendFactory = request.param
    fac.gate()
    return fac


@pytest.fixture
def swarms() -> Iterator[list[Swarm]]:
    """Swarms a test brings up; every one is brought down afterwards, whatever happened."""
    made: list[Swarm] = []
    yield made
    for s in made:
        try:
            s.down()
        except Exception as exc:  # keep tearing the others down
            print(f"teardown of {s.cfg.name} failed: {exc}")


@pytest.fixture
def up(factory: BackendFactory, swarms: list[Swarm]) -> Callable[..., Swarm]:
    """``up(replicas=1, engine='stub', ready=True)``: a swarm on the backend, torn down after the test."""

    def make(replicas: int = 1, engine: str = "stub", ready: bool = True, **over: Any) -> Swarm:
        s = Swarm(factory.config(replicas, engine, **over))
        swarms.append(s)
        s.up()
        if ready:
            s.wait_ready()
        return s

    return make
