"""Park and restore a Lepton swarm on the fake workspace (issue 42, item 1): the endpoint is scaled to
zero replicas (the SDK's ``deployment.stop``) and back; the swarm shows PARKED meanwhile."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from conftest import API_KEY

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm, keep_lease
from prefect_swarm.testing.fake_lepton import FakeLepton


def _answers(url: str) -> bool:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    except httpx.TransportError:
        return False
    return r.status_code == 200


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_park_scales_the_endpoint_to_zero_and_restore_brings_it_back(
    fake_lepton: FakeLepton, lepton_cfg: Callable[..., SwarmConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", fake_lepton.token)  # what a later command reattaches with
    cfg = lepton_cfg("lep-park")
    hold = Holding(StateStore())
    held = hold.bring_up(Swarm(cfg, store=hold.store, keep=True), keep_lease(cfg.name), wait=True)
    url = held.swarm.endpoint
    try:
        assert _answers(url)
        snap = hold.park(cfg.name, "by the test")
        w = fake_lepton.deployments[cfg.name]
        assert w.min_replicas() == 0 and not w.alive(), "the endpoint still runs a replica"
        assert snap.serving["deployment"] == cfg.name
        assert hold.store.require_swarm(cfg.name).phase is ServingPhase.PARKED
        assert hold.attach(cfg.name).status().phase is ServingPhase.PARKED
        assert not _answers(url)
        assert hold.park(cfg.name, "again") == snap  # idempotent
        got = hold.restore(cfg.name)
        assert got.ready is not None and got.ready.phase is ServingPhase.RUNNING
        assert fake_lepton.deployments[cfg.name].min_replicas() == cfg.replicas
        assert hold.attach(cfg.name).endpoint == url  # the same deployment, the same URL
        assert _answers(url)
    finally:
        hold.attach(cfg.name).down()
