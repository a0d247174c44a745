"""Idle parking, then wake on demand by a flow run (issue 42, item 2), on Slurm through the real worker.

A kept Slurm swarm with ``backend.idle_timeout_s`` parks itself once idle: none of its jobs is left in
squeue and its snapshot is kept. A ``batch-inference`` run on it then restores it (its ``swarm-up``
says it woke the swarm), writes every row once, and lets the swarm stay kept; ``down`` ends it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from stack import PrefectStack, job_variables
from test_slurm_flow import job_options, prompts, run_state, slurm_stub_swarm

from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import StateStore, keep_lease
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from _slurmkit import unique_name

pytestmark = [pytest.mark.slurm, pytest.mark.prefect_server, pytest.mark.slow]


def _logs(run_id: Any) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return "\n".join(entry.message for entry in logs)


def test_an_idle_slurm_swarm_parks_and_a_flow_run_wakes_it(
    prefect_stack: PrefectStack, need_slurm: None, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    name = unique_name("iw")
    data = slurm_stub_swarm(name, latency_ms=10, replicas=1)
    data["backend"]["idle_timeout_s"] = 10  # idle_action: park, the default
    cfg = SwarmConfig.model_validate(data)
    names = [f"psw-{name}-replicas", f"psw-{name}-lb"]
    hold = Holding(StateStore())
    swarm = Swarm(cfg, store=hold.store, keep=True)
    hold.bring_up(swarm, keep_lease(name), wait=True)
    try:
        wait_until(
            "the idle swarm to leave the queue",
            lambda: SlurmClient().squeue(names=names),
            until=lambda q: not q,
            timeout_s=120,
        )
        assert SwarmPaths.for_swarm(name).parked.exists()  # it parked (its snapshot kept), not stopped

        run = run_deployment(
            "batch-inference/on-demand",
            timeout=0,
            job_variables=job_variables(swarm_home),
            parameters={
                "swarm": data,
                "job": job_options(concurrency=2),
                "input": str(prompts(tmp_path / "in.parquet", 200)),
                "output": str(tmp_path / "out.parquet"),
                "shards": 2,
            },
        )
        state = wait_until(
            "the run to end", lambda: run_state(run.id), until=lambda s: s.is_final(), timeout_s=400, poll_s=1
        )
        assert state.type.value == "COMPLETED", (state.name, state.message)
        ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
        assert sorted(ids) == [f"r{i:05d}" for i in range(200)]  # every row once
        wait_until(
            "the run's wake line", lambda: _logs(run.id), until=lambda t: f"Woke swarm '{name}'" in t, timeout_s=60
        )
        rec = hold.store.require_swarm(name)
        assert rec.phase is ServingPhase.RUNNING, rec.phase  # kept: the run letting go leaves it up
        assert [x.owner for x in hold.holders(name)] == ["keep"]
    finally:
        Swarm.from_state(name, hold.store).down()
    wait_until(
        "nothing of the swarm queued", lambda: SlurmClient().squeue(names=names), until=lambda q: not q, timeout_s=60
    )
