"""Flows for a swarm's life outside a batch job: ``swarm-up``, ``swarm-park``, ``swarm-restore``,
``swarm-down``, ``run-job``."""

from __future__ import annotations

import time
from typing import Annotated, Any

from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from prefect_swarm.exceptions import StateError
from prefect_swarm.flows.hooks import teardown_hook
from prefect_swarm.flows.params import (
    TASK_THREADS,
    ConcurrencyArg,
    InputArg,
    JobArg,
    MaxFailedArg,
    OutputArg,
    ShardsArg,
    SwarmArg,
    job_spec,
    swarm_flow,
)
from prefect_swarm.holding import default_holding
from prefect_swarm.state import flow_run_lease, flow_run_owner
from prefect_swarm.tasks._common import current_flow_run_id, flow_result_storage, label_run, run_stop_event
from prefect_swarm.tasks.jobs import plan_shards, run_and_commit
from prefect_swarm.tasks.reaper import reap_quietly
from prefect_swarm.tasks.swarm import block_ref, resolve_swarm, teardown_flow_run, wait_ready
from prefect_swarm.tasks.swarm import swarm_down as swarm_down_task
from prefect_swarm.tasks.swarm import swarm_park as swarm_park_task
from prefect_swarm.tasks.swarm import swarm_restore as swarm_restore_task
from prefect_swarm.tasks.swarm import swarm_up as swarm_up_task


@swarm_flow(name="swarm-up")
def swarm_up(
    swarm: SwarmArg,
    reuse: bool = True,
) -> dict[str, Any]:
    """Bring a swarm up and leave it running (kept: the reaper leaves it alone) until `swarm-down`.

    If it never becomes ready it is torn down before the flow fails.

    Args:
        swarm: a saved SwarmSpec block (the run form's picker) or its name, a YAML config path,
            or an inline config (mapping).
        reuse: share a live kept swarm serving the same engine under another name.
    """
    cfg = resolve_swarm(swarm)
    reap_quietly()
    label_run(cfg.name, None)
    live = swarm_up_task(cfg, keep=True, reuse=reuse, source=block_ref(swarm))
    run_id = current_flow_run_id() or "-"
    try:
        endpoints = wait_ready(live)
    except BaseException:
        teardown_flow_run(run_id, include_kept=True)
        raise
    default_holding().keep(live.cfg.name, flow_run_owner(run_id))  # held until `swarm-down` / `prefect-swarm down`
    return {"name": live.cfg.name, "endpoints": endpoints, "fingerprint": live.fingerprint}


@swarm_flow(name="swarm-park")
def swarm_park(name: Annotated[str, Field(min_length=1)]) -> dict[str, Any]:
    """Park the live swarm ``name``: every GPU it holds is given back (Slurm: its jobs end; local: its
    engines stop) and what a fast restore needs is kept; it shows PARKED, its jobs pause. The next
    run that needs it, or `swarm-restore`, brings it back.

    Args:
        name: the swarm's name (`prefect-swarm list` shows them).
    """
    label_run(name, None)
    return swarm_park_task(name)


@swarm_flow(name="swarm-restore")
def swarm_restore(name: Annotated[str, Field(min_length=1)], timeout_s: float | None = None) -> list[str]:
    """Bring the parked swarm ``name`` back from its snapshot and wait until it is ready.

    Args:
        name: the swarm's name (`prefect-swarm list` shows them).
        timeout_s: readiness timeout in seconds; default: the swarm's ready_timeout_s.
    """
    label_run(name, None)
    return swarm_restore_task(name, timeout_s)


@swarm_flow(name="swarm-down")
def swarm_down(
    name: Annotated[str, Field(min_length=1)],
    force: bool = False,
) -> bool:
    """Release the kept swarm ``name`` and stop it unless a run still holds a lease on it
    (then the last holder stops it); ``force`` stops it whatever holds it. Idempotent.

    Args:
        name: the swarm's name (`prefect-swarm list` shows them).
        force: stop it even while flow runs or jobs hold it.
    """
    label_run(name, None)
    return swarm_down_task(name, force=force)


@swarm_flow(
    name="run-job",
    persist_result=True,
    result_storage=flow_result_storage(),  # PREFECT_SWARM_RESULT_STORAGE, else $PREFECT_SWARM_HOME/prefect-results
    task_runner=ThreadPoolTaskRunner(max_workers=TASK_THREADS),
    on_cancellation=[teardown_hook],
    on_crashed=[teardown_hook],
)
def run_job(
    name: Annotated[str, Field(min_length=1)],
    job: JobArg,
    input: InputArg,
    output: OutputArg,
    shards: ShardsArg = None,
    concurrency: ConcurrencyArg = None,
    max_failed_fraction: MaxFailedArg = None,
) -> dict[str, Any]:
    """Run a batch job on the existing swarm ``name`` (which stays up afterwards).

    Args:
        name: name of a swarm that is up (`prefect-swarm list`).
        job: a job kind ('chat', 'completion', 'embedding', 'module:Class') or JobOptions.
        input: parquet file/folder or OpenAI Batch JSONL.
        output: output file (one row per input row).
        shards: number of shards (job processes), at least 1; default: sized from the swarm (one
            process per 4096 requests in flight its replicas need).
        concurrency: most requests in flight per shard (a cap); default: each replica kept full
            (its batch capacity plus a short queue), adjusted from the replicas' /metrics.
        max_failed_fraction: largest share of failed rows (0..1) for the run to be Completed;
            default: the job's.
    """
    started = time.monotonic()
    hold = default_holding()
    live = hold.attach(name)
    if live.handle is None:
        raise StateError(f"swarm '{name}' has no handle: it was never brought up. `prefect-swarm up -c FILE` it first.")
    spec = job_spec(live.cfg, job, input, output, shards, max_failed_fraction, concurrency)
    plan = plan_shards(spec, name, live.cfg.run_dir)
    label_run(name, plan.spec.job_id)
    run_id = current_flow_run_id()
    if run_id is not None:  # hold it while the job runs: a `down` meanwhile leaves it to this run
        hold.hold(name, flow_run_lease(run_id))
    with run_stop_event():
        try:
            if plan.pending:
                wait_ready(live)
            return run_and_commit(plan, live if plan.pending else None, live.cfg, started, started, max_failed_fraction)
        finally:
            if run_id is not None:
                teardown_flow_run(run_id)
