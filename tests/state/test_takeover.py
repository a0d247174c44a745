"""A run queued behind an exclusive swarm's holder takes the live swarm over only when its config is
the same (engine fingerprint, backend, replica count): it holds it, so the holder's release leaves it
up; a swarm of another config (or not live) is left alone and stops with its holder."""

from __future__ import annotations

from pathlib import Path

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore, SwarmRecord, flow_run_lease
from prefect_swarm.swarm import engine_fingerprint
from prefect_swarm.testing.stub_engine import stub_swarm_config


def _cfg(**changes: object) -> SwarmConfig:
    return SwarmConfig.model_validate({**stub_swarm_config("excl", replicas=2), **changes})


def _recorded(store: StateStore, cfg: SwarmConfig, phase: ServingPhase = ServingPhase.RUNNING) -> None:
    store.put_swarm(
        SwarmRecord(
            name=cfg.name,
            backend=cfg.backend.type,
            config=cfg.redacted(),
            phase=phase,
            fingerprint=engine_fingerprint(cfg),
            flow_run_id="first",  # brought up by the run ahead
        )
    )


def test_a_queued_run_holds_only_a_live_swarm_of_its_own_config(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    hold = Holding(store)
    running = _cfg()
    _recorded(store, running)
    hold.hold("excl", flow_run_lease("first"))  # the run ahead, holding the slot

    queued = flow_run_lease("second")
    assert hold.hold_if_same(_cfg(), queued) is True
    assert hold.hold_if_same(_cfg(), queued) is True  # idempotent: one lease
    assert sorted(x.owner for x in store.list_leases("excl")) == ["flow-run:first", "flow-run:second"]
    # the holder lets go: the swarm is not stopped, the queued run holds it
    assert [x.owner for x in hold.release("excl", "flow-run:first")] == ["flow-run:second"]
    assert store.require_swarm("excl").phase is ServingPhase.RUNNING

    other = flow_run_lease("third")
    assert hold.hold_if_same(_cfg(replicas=3), other) is False  # another replica count
    assert hold.hold_if_same(_cfg(model="other-model"), other) is False  # another engine
    assert "flow-run:third" not in {x.owner for x in store.list_leases("excl")}

    store.update_swarm("excl", phase=ServingPhase.STOPPED)
    assert hold.hold_if_same(_cfg(), other) is False  # nothing live to take over
