"""Prefect tasks around the swarm and the job engine: retries, logging and artifacts live here.

Nothing below ``backends/``, ``jobs/`` or ``state/`` imports prefect; these tasks are the wrapper.
"""

from prefect_swarm.tasks._common import release_stop_event, stop_event
from prefect_swarm.tasks.jobs import JobPlan, commit_output, plan_shards, run_shard
from prefect_swarm.tasks.swarm import (
    block_ref,
    reattach,
    resolve_swarm,
    swarm_down,
    swarm_up,
    teardown_flow_run,
    wait_ready,
)

__all__ = [
    "JobPlan",
    "block_ref",
    "commit_output",
    "plan_shards",
    "reattach",
    "release_stop_event",
    "resolve_swarm",
    "run_shard",
    "stop_event",
    "swarm_down",
    "swarm_up",
    "teardown_flow_run",
    "wait_ready",
]
