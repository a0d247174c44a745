"""``batch_inference``: plan -> up -> ready -> map shards -> commit -> down.

A rerun with the same parameters skips finished shards (ledger + task cache) and, when the
output is already committed, never brings a swarm up at all. Teardown runs in ``finally`` and
in the cancel/crash hooks; a SIGKILLed run is covered by wall-time limits, the zombie
automation and the reaper (``prefect_swarm.tasks.reaper``).
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.task_runners import ThreadPoolTaskRunner

from prefect_swarm.flows.hooks import teardown_hook
from prefect_swarm.flows.params import JobOptions, job_spec
from prefect_swarm.tasks._common import label_run, run_stop_event
from prefect_swarm.tasks.jobs import plan_shards, run_and_commit
from prefect_swarm.tasks.reaper import reap_quietly
from prefect_swarm.tasks.swarm import block_ref, resolve_swarm, swarm_up, teardown_owned, wait_ready


@flow(
    name="batch-inference",
    task_runner=ThreadPoolTaskRunner(max_workers=64),  # type: ignore[arg-type]
    on_cancellation=[teardown_hook],
    on_crashed=[teardown_hook],
)
def batch_inference(
    swarm: str | dict[str, Any],
    job: JobOptions | str,
    input: str,
    output: str,
    shards: int = 1,
    keep_swarm: bool = False,
    reuse: bool = True,
) -> dict[str, Any]:
    """Run a batch job on a swarm brought up (or reused) for it, then tear the swarm down.

    Args:
        swarm: a SwarmSpec block name, a YAML config path, or an inline config (mapping).
        job: a job kind ('chat', 'completion', 'embedding', 'module:Class') or JobOptions.
        input: parquet file/folder or OpenAI Batch JSONL.
        output: output file (one row per input row).
        shards: number of shards (job processes).
        keep_swarm: leave the swarm running afterwards (a later run may reuse it).
        reuse: reuse a live swarm serving the same engine instead of starting one.
    """
    started = time.monotonic()
    cfg = resolve_swarm(swarm)
    reap_quietly()
    plan = plan_shards(job_spec(cfg, job, input, output, shards), cfg.name)
    label_run(cfg.name, plan.spec.job_id)
    up_at = None
    with tags(f"swarm:{cfg.name}", f"job:{plan.spec.job_id}"), run_stop_event():
        try:
            live = None
            if plan.pending:
                live = swarm_up(cfg, keep=keep_swarm, reuse=reuse, source=block_ref(swarm))
                up_at = time.monotonic()
                wait_ready(live)
            return run_and_commit(plan, live, cfg, started, up_at)
        finally:
            if up_at is not None:
                get_run_logger().info("Swarm time this run: %.1f s.", time.monotonic() - up_at)
            teardown_owned(keep_swarm)
