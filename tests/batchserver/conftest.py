"""Fixtures of the batch service tests: services started per module (each with its own home), stopped
at the end with whatever they left running (see service_kit)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from service_kit import Service, write_config


@pytest.fixture(scope="module")
def service_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Service]]:
    """Start services (each with its own home); each is stopped, and its swarms stopped, at the end."""
    started: list[tuple[Service, list[str]]] = []

    def make(models: dict[str, Any], env: dict[str, str] | None = None, **fields: Any) -> Service:
        home = tmp_path_factory.mktemp("batch-home")
        svc = Service(home, write_config(home, models, **fields), env).start()
        started.append((svc, [m["name"] for m in models.values() if isinstance(m, dict)]))
        return svc

    yield make
    from prefect_swarm.state import StateStore

    for svc, swarms in started:
        svc.stop()  # the jobs of batches still in flight keep running (a restart would pick them up): stop them
        for job in StateStore(svc.home / "state.db").list_jobs():
            if job.status.active:
                svc.cli("job", "cancel", job.id)
        for name in swarms:  # a swarm a killed service left behind, or one a test's job still held
            svc.cli("down", name, "-y", "--force")
