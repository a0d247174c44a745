"""``batch_inference``: plan -> up -> ready -> map shards -> down -> commit (the swarm is released
as soon as the last row is answered; the commit publishes after).

A rerun with the same parameters skips finished shards (ledger + task cache) and, when the
output is already committed, never brings a swarm up at all. Teardown runs in ``finally`` and
in the cancel/crash hooks; a SIGKILLed run is covered by wall-time limits, the zombie
automation and the reaper (``prefect_swarm.tasks.reaper``).
"""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from prefect_swarm.config.swarm import Sharing
from prefect_swarm.exceptions import REPORTED_AS_MESSAGE, BudgetReached
from prefect_swarm.flows.hooks import teardown_hook
from prefect_swarm.flows.params import (
    TASK_THREADS,
    ConcurrencyArg,
    InputArg,
    JobArg,
    MaxCostArg,
    MaxFailedArg,
    MaxGpuHoursArg,
    OutputArg,
    ShardsArg,
    SwarmArg,
    job_spec,
    run_budget,
    swarm_flow,
    with_budget,
)
from prefect_swarm.launch import budget_reached
from prefect_swarm.tasks._common import failed_run, flow_result_storage, label_run, run_stop_event
from prefect_swarm.tasks.events import job_event
from prefect_swarm.tasks.jobs import plan_shards, run_and_commit
from prefect_swarm.tasks.reaper import reap_quietly
from prefect_swarm.tasks.swarm import block_ref, resolve_swarm, swarm_up, swarm_use, teardown_owned, wait_ready


@swarm_flow(
    name="batch-inference",
    persist_result=True,
    result_storage=flow_result_storage(),  # PREFECT_SWARM_RESULT_STORAGE, else $PREFECT_SWARM_HOME/prefect-results
    task_runner=ThreadPoolTaskRunner(max_workers=TASK_THREADS),
    on_cancellation=[teardown_hook],
    on_crashed=[teardown_hook],
)
def batch_inference(
    swarm: SwarmArg,
    job: JobArg,
    input: InputArg,
    output: OutputArg,
    shards: ShardsArg = None,
    concurrency: ConcurrencyArg = None,
    keep_swarm: bool = False,
    reuse: bool = True,
    max_failed_fraction: MaxFailedArg = None,
    sharing: Sharing | None = None,
    max_gpu_hours: MaxGpuHoursArg = None,
    max_cost_usd: MaxCostArg = None,
    retry_failed: bool = False,
) -> dict[str, Any]:
    """Run a batch job on a swarm brought up (or shared) for it, then release the swarm: it is
    stopped when no other run or job holds it.

    Args:
        swarm: a saved SwarmSpec block (the run form's picker) or its name, a YAML config path,
            or an inline config (mapping).
        job: a job kind ('chat', 'completion', 'embedding', 'module:Class') or JobOptions.
        input: parquet file/folder or OpenAI Batch JSONL.
        output: a folder or prefix ending with '/' (a parquet dataset: part files by shard,
            _manifest.json, _SUCCESS, a row_position column; the choice for large jobs), or one
            file (*.parquet, *.jsonl); one row per input row either way.
        shards: number of shards (job processes), at least 1; default: sized from the swarm (one
            process per 4096 requests in flight its replicas need).
        concurrency: most requests in flight per shard (a cap); default: each replica kept full
            (its batch capacity plus a short queue), adjusted from the replicas' /metrics.
        keep_swarm: leave the swarm running afterwards (a later run may share it).
        reuse: share a live kept swarm serving the same engine under another name.
        max_failed_fraction: largest share of failed rows (0..1) for the run to be Completed;
            above it the run is Failed with the counts and the failed-rows file. Default: the job's.
        sharing: 'shared': concurrent runs share the swarm (each holds a lease; the last one stops
            it); 'exclusive': one run at a time (the global concurrency limit swarm:NAME of 1).
            Default: the swarm config's own 'sharing' field.
        max_gpu_hours: budget of this run in GPU-hours of the swarm; with the swarm's own
            backend.cost.max_gpu_hours the lower wins. Past it the shards are stopped (they flush),
            the swarm is torn down and the run ends Failed with "budget reached: X of Y"; a rerun
            with a larger budget resumes.
        max_cost_usd: the same in USD (needs a price in the swarm's backend.cost).
        retry_failed: rerun only the rows the job's ledger holds as errors (a run that ended
            Failed on failed rows, rerun with the same other parameters): the swarm is brought up
            again when it is gone, only those rows are sent, the output is committed again and the
            run is Completed when the verdict passes. Each row's earlier error reasons are kept in
            its ``error`` (see the failed-rows file). What `prefect-swarm job retry` does.
    """
    try:
        started = time.monotonic()
        cfg = resolve_swarm(swarm)
        budget = run_budget(cfg, max_gpu_hours, max_cost_usd)
        reap_quietly()
        spec = job_spec(cfg, job, input, output, shards, max_failed_fraction, concurrency)
        spec = spec.model_copy(update={"retry_failed": retry_failed})  # the ledger's error rows count as pending
        plan = plan_shards(spec, cfg.name, cfg.run_dir)
        label_run(cfg.name, plan.spec.job_id)  # the flow run's tags; its task runs carry none (see label_run)
        up_at = None
        with swarm_use(cfg, sharing), run_stop_event():
            live = None
            try:
                if plan.pending:
                    live = with_budget(swarm_up(cfg, keep=keep_swarm, reuse=reuse, source=block_ref(swarm)), budget)
                    up_at = time.monotonic()
                    wait_ready(live)
                # the swarm is released as soon as the last row is answered, before the commit publishes
                release = lambda: teardown_owned(keep_swarm)  # noqa: E731
                return run_and_commit(plan, live, cfg, started, up_at, max_failed_fraction, release=release)
            except BudgetReached as exc:
                teardown_owned(False)  # the jobs flush first: the final word is the spend at their exit
                final = budget_reached(live, plan.spec) if live is not None else exc
                job_event("budget-reached", str(plan.spec.job_id), cfg.name, message=str(final).splitlines()[0])
                if live is not None:
                    live.down()  # the budget is the swarm's: it stops even when kept or held by others
                raise final from exc
            finally:
                if up_at is not None:
                    get_run_logger().info("Swarm time this run: %.1f s.", time.monotonic() - up_at)
                teardown_owned(keep_swarm)
    except REPORTED_AS_MESSAGE as exc:  # not a bug: the run ends Failed with the message alone
        return failed_run(exc)
