"""A bring-up that failed or died blocks nobody: the next `up` of the name starts at once.

Real local swarms of stub engines; the state a killed `up` leaves is made by a real process that
claims the swarm and dies before it submits anything.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import BackendError, PrefectSwarmError, ReadinessError
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import LeaseKind, StateStore, keep_lease, process_lease
from prefect_swarm.swarm import LIVE_PHASES, Swarm
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import engine_command


def _config(name: str, **engine: Any) -> SwarmConfig:
    return SwarmConfig.model_validate(
        {
            "name": name,
            "model": "stub-model",
            "replicas": 1,
            "gpus_per_replica": 0,
            "port": free_port_block(1),
            "ready_timeout_s": 600,  # a join that waited on a dead bring-up would wait ~11 minutes
            "engine": {"kind": "command", "command": engine_command(), "startup_timeout_s": 60, **engine},
            "backend": {"type": "local"},
        }
    )


@pytest.fixture
def name() -> Iterator[str]:
    swarm_name = f"bu-{uuid.uuid4().hex[:8]}"
    yield swarm_name
    rec = StateStore().get_swarm(swarm_name)
    if rec is not None:
        Swarm.from_state(swarm_name).down()


def test_failed_bring_up_leaves_nothing_that_blocks_the_next(name: str) -> None:
    store = StateStore()
    bad = _config(name)
    with socket.socket() as taken:  # its replica's port is taken: create_or_update fails after the claim
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", bad.port))
        taken.listen()
        with pytest.raises(BackendError, match="is taken"):
            default_holding(store).join(Swarm(bad, store=store), keep_lease(name), reconcile=True)
    rec = store.require_swarm(name)
    assert rec.phase is ServingPhase.FAILED and rec.handle is None
    assert store.list_leases(name) == []  # neither the keep lease nor the bring-up lease is left

    fixed = Swarm(_config(name), store=store)
    started = time.monotonic()
    assert default_holding(store).join(fixed, keep_lease(name), reconcile=True) is True  # brought up here
    assert time.monotonic() - started < 15
    assert store.require_swarm(name).phase is ServingPhase.INITIALIZING
    assert [x.owner for x in store.list_leases(name)] == ["keep"]
    fixed.wait_ready()


DIE_MID_BRING_UP = """
import dataclasses, os, sys
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import LeaseKind, StateStore
from prefect_swarm.state import keep_lease, process_lease
from prefect_swarm.swarm import LIVE_PHASES, Swarm
cfg = SwarmConfig.model_validate_json(sys.argv[1])
swarm = Swarm(cfg)
store = swarm.store
store.claim_swarm(swarm.new_record(ServingPhase.PENDING, None), keep_lease(cfg.name), LIVE_PHASES)
bringer = process_lease(LeaseKind.BRING_UP, f"bring-up:test:{os.getpid()}")
store.put_lease(dataclasses.replace(bringer, swarm=cfg.name))
os._exit(9)  # killed before it could submit or record anything
"""


def test_bring_up_whose_process_died_blocks_nobody(name: str, tmp_path: Path) -> None:
    cfg = _config(name)
    subprocess.run([sys.executable, "-c", DIE_MID_BRING_UP, cfg.model_dump_json()], check=False)
    store = StateStore()
    assert store.require_swarm(name).phase is ServingPhase.PENDING  # what a killed `up` leaves
    assert any(x.kind is LeaseKind.BRING_UP for x in store.list_leases(name))

    swarm = Swarm(cfg, store=store)
    started = time.monotonic()
    assert default_holding(store).join(swarm, keep_lease(name), reconcile=True) is True
    assert time.monotonic() - started < 15
    assert not any(x.kind is LeaseKind.BRING_UP for x in store.list_leases(name))
    swarm.wait_ready()


def test_waiting_on_a_live_bring_up_ends_with_a_clear_error(name: str) -> None:
    """A bring-up still in progress (its process lives) is waited for; giving up is a prefect-swarm
    error naming who brings it up (printed without a traceback), not a bare TimeoutError."""
    cfg = _config(name)
    store = StateStore()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        swarm = Swarm(cfg, store=store)
        store.claim_swarm(swarm.new_record(ServingPhase.PENDING, None), keep_lease(name), LIVE_PHASES)
        bringer = process_lease(LeaseKind.BRING_UP, f"bring-up:elsewhere:{holder.pid}")
        store.put_lease(dataclasses.replace(bringer, swarm=name, pid=holder.pid))
        with pytest.raises(ReadinessError, match=f"still being brought up by bring-up:elsewhere:{holder.pid}") as err:
            default_holding(store).join(Swarm(cfg, store=store), process_lease(), wait_s=1.5, poll_s=0.2)
        assert isinstance(err.value, PrefectSwarmError) and "prefect-swarm down" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    store.update_swarm(name, phase=ServingPhase.FAILED)
