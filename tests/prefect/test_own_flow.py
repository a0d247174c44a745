"""Flows of your own from the public pieces (prefect_swarm.tasks.swarm): they leave no swarm running.

The documented example (examples/own_flow.py: hold_swarm -> a direct request -> run_job -> let go)
runs through the real worker, deployed from its file as a user deploys theirs; the naive
composition of the tasks (swarm_up -> wait_ready -> swarm_down) runs in this process.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import prompts, stub_swarm, swarm_processes
from prefect import flow
from stack import POOL, REPO, PrefectStack, job_variables

from prefect_swarm.config import load_config
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore
from prefect_swarm.tasks.swarm import swarm_down, swarm_up, wait_ready

pytestmark = [pytest.mark.prefect_server]


def _left_nothing(name: str, swarm_home: Path, port: int) -> None:
    store = StateStore()
    assert store.require_swarm(name).phase is ServingPhase.STOPPED
    assert store.list_leases(name) == []
    assert swarm_processes(swarm_home, name, port) == []


def test_the_own_flow_example_runs_through_a_worker(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    from prefect_swarm.testing.ports import free_port_block

    example = flow.from_source(source=str(REPO / "examples"), entrypoint="own_flow.py:own_flow")
    example.deploy(
        name="own-flow", work_pool_name=POOL, job_variables=job_variables(swarm_home), print_next_steps=False
    )  # type: ignore[attr-defined]
    port = free_port_block(1)
    cfg = stub_swarm("own", replicas=1, port=port)
    out = tmp_path / "answers.parquet"
    run = run_deployment(
        "own-flow/own-flow",
        parameters={"swarm": cfg, "input": str(prompts(tmp_path / "in.parquet", 12)), "output": str(out)},
        timeout=240,
    )
    assert run.state is not None and run.state.is_completed(), run.state
    assert pq.read_table(out).num_rows == 12
    _left_nothing("own", swarm_home, port)


@flow(name="naive-composition")
def naive(cfg: dict[str, object]) -> list[str]:
    live = swarm_up(load_config(data=cfg))
    endpoints = wait_ready(live)
    swarm_down(live.cfg.name)
    return endpoints


def test_up_wait_down_in_a_flow_of_your_own_stops_the_swarm(prefect_api: PrefectStack, swarm_home: Path) -> None:
    """`swarm_down` in a run lets go of that run's own hold: the swarm stops (nobody else holds it)."""
    from prefect_swarm.testing.ports import free_port_block

    port = free_port_block(1)
    assert naive(stub_swarm("naive", port=port))[0].startswith("http://127.0.0.1:")
    _left_nothing("naive", swarm_home, port)
