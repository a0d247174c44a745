"""Prefect events this package emits, for automations to trigger on.

``prefect-swarm.swarm.{up,ready,down,reaped}`` on resource ``prefect-swarm.swarm.<name>`` and
``prefect-swarm.job.{shard.completed,shard.failed,committed,succeeded,failed,budget-reached}`` on
``prefect-swarm.job.<id>`` (``committed`` once per commit, not again for a rerun that finds the
output committed; ``succeeded``/``failed`` the run's verdict against ``max_failed_fraction``;
``budget-reached`` when a run's GPU-hour or $ budget stopped it),
each related to the swarm, the SwarmSpec block it came from (when any) and the flow run, with the
counts in the payload. Job events with a ``failed`` count also carry the resource label
``prefect-swarm.failed-rows`` (``"true"`` when it is above 0), so an automation can trigger on
failed rows (a trigger matches labels, not payload values). Emitting never fails a run.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect_swarm.tasks._common import current_flow_run_id

log = logging.getLogger("prefect_swarm.tasks.events")

PREFIX = "prefect-swarm"

FAILED_ROWS_LABEL = f"{PREFIX}.failed-rows"
"""Resource label of job events: ``"true"`` when the event's ``failed`` count is above 0."""


def _related(swarm: str | None, source: str | None, flow_run_id: str | None) -> list[dict[str, str]]:
    related = []
    if swarm:
        related.append({"prefect.resource.id": f"{PREFIX}.swarm.{swarm}", "prefect.resource.role": "swarm"})
    if source:
        related.append({"prefect.resource.id": f"{PREFIX}.block.{source}", "prefect.resource.role": "block"})
    run_id = flow_run_id or current_flow_run_id()
    if run_id:
        related.append({"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.role": "flow-run"})
    return related


def _emit(event: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict[str, Any]) -> None:
    from prefect.events import emit_event

    try:
        emit_event(event=event, resource=resource, related=related, payload=payload)
    except Exception as exc:  # events are for automations; a run never fails for one
        log.warning("could not emit event %s: %s", event, exc)


def swarm_event(
    what: str, swarm: str, *, source: str | None = None, flow_run_id: str | None = None, **payload: Any
) -> None:
    """Emit ``prefect-swarm.swarm.<what>`` (up, ready, down, reaped) for swarm ``swarm``."""
    resource = {"prefect.resource.id": f"{PREFIX}.swarm.{swarm}", "prefect.resource.name": swarm}
    _emit(f"{PREFIX}.swarm.{what}", resource, _related(None, source, flow_run_id), {"swarm": swarm, **payload})


def job_event(what: str, job_id: str, swarm: str | None, **payload: Any) -> None:
    """Emit ``prefect-swarm.job.<what>`` (shard.completed, shard.failed, committed, succeeded, failed,
    budget-reached) for job ``job_id``.

    ``committed`` also carries the job's ``cost`` (gpu_hours, usd, usd_per_million_tokens: see
    :func:`~prefect_swarm.config.cost.job_cost`)."""
    if what == "committed" and "cost" not in payload:
        payload["cost"] = _job_cost(job_id)
    resource = {"prefect.resource.id": f"{PREFIX}.job.{job_id}", "prefect.resource.name": job_id}
    if "failed" in payload:
        resource[FAILED_ROWS_LABEL] = "true" if int(payload.get("failed") or 0) > 0 else "false"
    _emit(f"{PREFIX}.job.{what}", resource, _related(swarm, None, None), {"job_id": job_id, "swarm": swarm, **payload})


def _job_cost(job_id: str) -> dict[str, Any] | None:
    """The job's cost as `job status` shows it (read-only: ledger progress, recorded swarm config)."""
    from prefect_swarm.config.cost import job_cost
    from prefect_swarm.jobs.checkpoint.plan import job_progress
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.state import StateStore

    try:
        store = StateStore()
        rec = store.require_job(job_id)
        swarm = store.get_swarm(rec.swarm) if rec.swarm else None
        return job_cost(job_progress(JobSpec.model_validate(rec.spec)), swarm.config if swarm else None)
    except Exception as exc:  # a cost that cannot be read leaves the event without it
        log.warning("could not price job %s: %s", job_id, exc)
        return None
