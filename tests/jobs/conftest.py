"""Fixtures of the job engine tests: a stub engine per module, stub engines with fault knobs, GPU-like
simulated replicas, and
pytest's signal handlers put back after a test that ran the job entry point in-process."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prefect_swarm.testing import free_port
from prefect_swarm.testing.gpu_sim import MODULE
from prefect_swarm.testing.stub_engine import StubEngine


@pytest.fixture(scope="module")
def stub() -> Iterator[StubEngine]:
    """One fast stub engine for the module."""
    with StubEngine(free_port(), latency_ms=1) as s:
        yield s


@pytest.fixture
def stub_factory() -> Iterator[Callable[..., StubEngine]]:
    """Start stub engines with fault knobs; all stopped at the end of the test."""
    started: list[StubEngine] = []

    def start(**knobs: Any) -> StubEngine:
        s = StubEngine(free_port(), **knobs).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def sim() -> Iterator[Callable[..., StubEngine]]:
    """Start GPU-like simulated replicas with knobs (``max_num_seqs=64``...); all stopped at the end."""
    started: list[StubEngine] = []

    def start(**knobs: Any) -> StubEngine:
        engine = StubEngine(free_port(), module=MODULE, **knobs).start(timeout_s=60)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.stop()


@pytest.fixture
def own_signals() -> Iterator[None]:
    """The job entry point installs SIGTERM/SIGUSR1 handlers: put pytest's back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
