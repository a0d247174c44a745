"""A ``with Swarm(cfg)`` block holds its swarm while it runs: a job that let go of the swarm from
elsewhere (as ``job submit`` does at its end) does not stop it; leaving the block does."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import LeaseKind, StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config


def test_a_job_letting_go_does_not_stop_a_swarm_a_with_block_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(tmp_path / "home"))
    cfg = SwarmConfig.model_validate(stub_swarm_config("held-by-block"))
    store = StateStore(tmp_path / "home" / "state.db")
    with Swarm(cfg, store=store) as swarm:
        holding = Holding(store)
        block = [x for x in holding.holders(cfg.name) if x.owner.startswith("with:")]
        assert [x.kind for x in block] == [LeaseKind.PROCESS]
        for job in ("j1", "j2"):  # two jobs, one after the other, each holding and letting go
            with holding.job_hold(cfg.name, job, running=lambda: True) as lease:
                pass
            left = holding.release(cfg.name, lease.owner)
            assert [x.owner for x in left] == [block[0].owner], left
            assert store.require_swarm(cfg.name).phase is ServingPhase.RUNNING
            assert httpx.get(swarm.endpoint + "/health", timeout=5).status_code == 200
    assert store.require_swarm(cfg.name).phase is ServingPhase.STOPPED
    assert Holding(store).holders(cfg.name) == []
