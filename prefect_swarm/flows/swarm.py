"""Flows for a swarm's life outside a batch job: ``swarm-up``, ``swarm-down``, ``run-job``."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, tags
from prefect.task_runners import ThreadPoolTaskRunner

from prefect_swarm.exceptions import StateError
from prefect_swarm.flows.hooks import teardown_hook
from prefect_swarm.flows.params import JobOptions, job_spec
from prefect_swarm.state import StateStore
from prefect_swarm.tasks._common import current_flow_run_id, label_run, run_stop_event
from prefect_swarm.tasks.jobs import plan_shards, run_and_commit
from prefect_swarm.tasks.reaper import reap_quietly
from prefect_swarm.tasks.swarm import block_ref, reattach, resolve_swarm, teardown_flow_run, wait_ready
from prefect_swarm.tasks.swarm import swarm_down as swarm_down_task
from prefect_swarm.tasks.swarm import swarm_up as swarm_up_task


@flow(name="swarm-up")
def swarm_up(swarm: str | dict[str, Any], reuse: bool = True) -> dict[str, Any]:
    """Bring a swarm up and leave it running (kept: the reaper leaves it alone) until `swarm-down`.

    If it never becomes ready it is torn down before the flow fails.
    """
    cfg = resolve_swarm(swarm)
    reap_quietly()
    label_run(cfg.name, None)
    live = swarm_up_task(cfg, keep=True, reuse=reuse, source=block_ref(swarm))
    try:
        endpoints = wait_ready(live)
    except BaseException:
        teardown_flow_run(current_flow_run_id() or "-", include_kept=True)
        raise
    return {"name": live.cfg.name, "endpoints": endpoints, "fingerprint": live.fingerprint}


@flow(name="swarm-down")
def swarm_down(name: str) -> None:
    """Stop swarm ``name`` (idempotent)."""
    with tags(f"swarm:{name}"):
        swarm_down_task(name)


@flow(
    name="run-job",
    task_runner=ThreadPoolTaskRunner(max_workers=64),  # type: ignore[arg-type]
    on_cancellation=[teardown_hook],
    on_crashed=[teardown_hook],
)
def run_job(name: str, job: JobOptions | str, input: str, output: str, shards: int = 1) -> dict[str, Any]:
    """Run a batch job on the existing swarm ``name`` (which stays up afterwards)."""
    started = time.monotonic()
    live = reattach(name, StateStore())
    if live.handle is None:
        raise StateError(f"swarm '{name}' has no handle: it was never brought up. `prefect-swarm up` it first.")
    plan = plan_shards(job_spec(live.cfg, job, input, output, shards), name)
    label_run(name, plan.spec.job_id)
    with tags(f"swarm:{name}", f"job:{plan.spec.job_id}"), run_stop_event():
        if plan.pending:
            wait_ready(live)
        return run_and_commit(plan, live if plan.pending else None, live.cfg, started, started)
