"""Helpers for local-backend tests: stub-engine configs, status polling."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingStatus
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

STUB = engine_command()


def stub_config(
    replicas: int = 1, command: list[str] | None = None, backend: dict[str, Any] | None = None, **over: Any
) -> SwarmConfig:
    """A local swarm of stub engines, with fast watchdog settings."""
    data: dict[str, Any] = {
        "name": f"loc-{uuid.uuid4().hex[:8]}",
        "model": "stub-model",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": free_port_block(replicas),
        "ready_timeout_s": 60,
        "engine": {"kind": "command", "command": command or STUB, "python": sys.executable, "startup_timeout_s": 60},
        "backend": {
            "type": "local",
            "health_interval_s": 0.3,
            "restart_backoff_s": 0.1,
            "startup_grace_s": 0.5,
            "max_restarts": 2,
            **(backend or {}),
        },
    }
    data.update(over)
    return SwarmConfig.model_validate(data)


def wait_for(swarm: Swarm, ok: Callable[[ServingStatus], bool], timeout_s: float = 30) -> ServingStatus:
    """The swarm's status once it passes ``ok`` (:func:`~prefect_swarm.testing.waiting.wait_until`)."""
    return wait_until(
        f"swarm '{swarm.cfg.name}' status to pass {ok.__name__}", swarm.status, until=ok, timeout_s=timeout_s
    )
