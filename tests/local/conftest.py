"""Fixtures for local-backend tests: swarms of stub engines that are always brought down."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from local_kit import stub_config

from prefect_swarm.swarm import Swarm


@pytest.fixture
def local_swarm() -> Iterator[Callable[..., Swarm]]:
    """``local_swarm(replicas=1, ready=True, **stub_config kwargs)``; every swarm is brought down after."""
    made: list[Swarm] = []

    def make(replicas: int = 1, ready: bool = True, **kw: Any) -> Swarm:
        s = Swarm(stub_config(replicas, **kw))
        made.append(s)
        s.up()
        if ready:
            s.wait_ready()
        return s

    yield make
    for s in made:
        s.down()
