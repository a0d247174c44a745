"""The scheduled ``reap-orphans`` flow (deployed on a cron, and triggered when a run crashes)."""

from __future__ import annotations

from prefect import flow, get_run_logger

from prefect_swarm.tasks.reaper import reap_orphans


@flow(name="reap-orphans")
def reap_orphans_flow(dry_run: bool = False) -> list[str]:
    """Stop swarms whose flow run has ended (Completed/Failed/Cancelled/Crashed) and were not kept."""
    reaped = reap_orphans(dry_run=dry_run)
    get_run_logger().info("Reaped %d orphan swarm(s): %s", len(reaped), ", ".join(reaped) or "none")
    return reaped
