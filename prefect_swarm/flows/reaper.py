"""The scheduled ``reap-orphans`` flow (deployed on a cron, and triggered when a run crashes)."""

from __future__ import annotations

from prefect import get_run_logger

from prefect_swarm.flows.params import swarm_flow
from prefect_swarm.tasks._common import tag_run
from prefect_swarm.tasks.reaper import reap_orphans


@swarm_flow(name="reap-orphans")
def reap_orphans_flow(dry_run: bool = False) -> list[str]:
    """Stop swarms that no live user holds any more (their flow runs ended, their processes and
    jobs are gone) and that were not kept.

    Args:
        dry_run: only say what would be stopped.
    """
    reaped = reap_orphans(dry_run=dry_run, logger=get_run_logger())
    tag_run(*(f"swarm:{name}" for name in reaped))  # `history NAME` shows who stopped it
    get_run_logger().info("Reaped %d orphan swarm(s): %s", len(reaped), ", ".join(reaped) or "none")
    return reaped
