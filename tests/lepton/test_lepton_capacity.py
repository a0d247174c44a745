"""An endpoint that cannot be scheduled stays queued (the state says Not Ready, the replicas wait
for capacity): ``wait_ready`` gives up after ``backend.queue_timeout_s`` with a CapacityError that
says why, and the swarm is torn down, on both deployment APIs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import CapacityError
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]


@pytest.mark.parametrize(
    ("fake_lepton", "reason"),
    [
        ({"queue_deployments": ("lep",)}, "NoCapacity: no node has capacity for resource shape gpu.h100-sxm"),
        ({"queue_deployments": ("lep",), "new_deployment_api": True}, "no node has taken the replica"),
    ],
    indirect=["fake_lepton"],
    ids=["legacy", "new-api"],
)
def test_a_queued_endpoint_fails_with_capacity_error_after_the_queue_timeout(
    lepton_cfg: Make, fake_lepton: FakeLepton, reason: str
) -> None:
    cfg = lepton_cfg(queue_timeout_s=1.0).model_copy(update={"ready_timeout_s": 120})
    swarm = Swarm(cfg)
    t0 = time.monotonic()
    with pytest.raises(CapacityError, match=r"stayed queued for capacity for 1s") as err, swarm:
        pass
    assert time.monotonic() - t0 < 30  # the queue timeout, not ready_timeout_s
    assert reason in str(err.value) and "queue_timeout_s" in str(err.value)
    assert fake_lepton.deployments == {} and fake_lepton.jobs == {}  # torn down all the same


def test_a_queued_endpoint_reads_pending(
    lepton_cfg: Make, fake_lepton: FakeLepton, known_status: Callable[..., Any]
) -> None:
    from prefect_swarm.backends.lepton.serving import LeptonServing
    from prefect_swarm.paths import SwarmPaths

    fake_lepton.queue_deployments = ("lep",)
    cfg = lepton_cfg()
    srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
    handle = srv.create_or_update(cfg)
    status = known_status(srv, handle)
    assert status.phase is ServingPhase.PENDING and "NoCapacity" in status.detail
    srv.delete(handle)
