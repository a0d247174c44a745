"""A workspace with ``features.enable_new_deployment_api``: the SDK sends endpoints to the new
Endpoint API (no metadata labels, no per-deployment readiness). Up, ready, status, update and down
must work there as on the legacy API, through the real SDK."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.interfaces.types import ReplicaHealth
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]
NEW_API = pytest.mark.parametrize("fake_lepton", [{"new_deployment_api": True}], indirect=True)


def serving(cfg: SwarmConfig) -> LeptonServing:
    return LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))


@NEW_API
def test_up_ready_update_down_on_the_new_endpoint_api(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    assert handle.url
    st = srv.wait_ready(handle, timeout_s=30)
    assert st.phase is ServingPhase.RUNNING and "chat completion answered" in st.detail
    assert [r.health for r in st.replicas] == [ReplicaHealth.HEALTHY]
    # it went through /endpoints only, and no readiness route was asked for
    paths = [path for _method, path, _status in fake_lepton.requests]
    assert any(path.endswith("/endpoints") for path in paths)
    assert not any("/deployments" in path or path.endswith("/readiness") for path in paths)
    assert "labels" not in fake_lepton.deployments["lep"].body["metadata"]
    # an update goes through the endpoint PATCH (components replaced) and the replicas follow
    srv.create_or_update(cfg.model_copy(update={"replicas": 2}))
    assert fake_lepton.deployments["lep"].body["spec"]["resource_requirement"]["min_replicas"] == 2
    st = srv.wait_ready(handle, timeout_s=30)
    assert st.phase is ServingPhase.RUNNING
    srv.delete(handle)
    assert srv.status(handle).phase is ServingPhase.STOPPED
    assert fake_lepton.deployments == {} and fake_lepton.running_processes() == []


def test_the_legacy_api_keeps_labels_and_readiness(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    srv.wait_ready(handle, timeout_s=30)
    assert fake_lepton.deployments["lep"].body["metadata"]["labels"] == {
        "prefect-swarm-swarm": "lep",
        "prefect-swarm-owner": srv.owner,
    }
    assert any(path.endswith("/readiness") for _m, path, _s in fake_lepton.requests)
    srv.delete(handle)
