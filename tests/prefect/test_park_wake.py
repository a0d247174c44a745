"""Wake on demand by flow runs (issue 42, item 2), through the real worker and server.

A kept swarm is parked; three batch-inference runs on it start at once: exactly one of them restores
it (its ``swarm-up`` task says it woke the swarm and emits ``prefect-swarm.swarm.restored``), the other
two wait and share it; every run completes with every row, and the kept swarm stays up after them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack, job_variables

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore, keep_lease
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing import wait_until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _state_and_logs(run_id: Any) -> tuple[Any, str]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read() -> tuple[Any, str]:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return run.state, "\n".join(entry.message for entry in logs)

    return asyncio.run(read())


def test_three_runs_on_a_parked_swarm_restore_it_once(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    cfg = stub_swarm("parked-wake", replicas=2, latency_ms=10)
    hold = Holding(StateStore())
    swarm = Swarm(SwarmConfig.model_validate(cfg), store=hold.store, keep=True)
    hold.bring_up(swarm, keep_lease(swarm.cfg.name), wait=True)
    try:
        hold.park(swarm.cfg.name, "by the test")
        assert hold.store.require_swarm(swarm.cfg.name).phase is ServingPhase.PARKED
        runs = [
            run_deployment(
                "batch-inference/on-demand",
                timeout=0,
                flow_run_name=f"parked-wake-{i}",
                job_variables=job_variables(swarm_home),
                parameters={
                    "swarm": cfg,
                    "job": job_options(concurrency=2),
                    "input": str(prompts(tmp_path / f"in-{i}.parquet", 60)),
                    "output": str(tmp_path / f"out-{i}.parquet"),
                },
            )
            for i in range(3)
        ]

        def final() -> bool:
            return all((s := _state_and_logs(r.id)[0]) is not None and s.is_final() for r in runs)

        wait_until("three runs final", final, timeout_s=400, poll_s=1)
        seen = [_state_and_logs(r.id) for r in runs]
        assert all(state.type.value == "COMPLETED" for state, _ in seen), [(s.name, s.message) for s, _ in seen]
        for i in range(3):
            table = pq.read_table(tmp_path / f"out-{i}.parquet")
            assert table.num_rows == 60 and set(table.column("status").to_pylist()) == {"ok"}

        def woke() -> list[int]:
            return [text.count("Woke swarm 'parked-wake'") for _, text in (_state_and_logs(r.id) for r in runs)]

        wait_until("one run's wake log", woke, until=lambda n: sum(n) == 1, timeout_s=60)  # logs arrive after the state
        rec = hold.store.require_swarm(swarm.cfg.name)
        assert rec.phase is ServingPhase.RUNNING, rec.phase  # kept: the runs letting go leave it up
        assert [x.owner for x in hold.holders(swarm.cfg.name)] == ["keep"]
    finally:
        Swarm.from_state(swarm.cfg.name, hold.store).down()
