"""The orphan reaper: stop swarms whose flow run has ended, unless they were asked to be kept.

A SIGKILLed flow runs no ``finally`` and no hook; once Prefect marks its run terminal (the
heartbeat zombie automation turns a silent run Crashed) the swarm it owned is an orphan. The
reaper runs at the start of every flow, in ``prefect-swarm db prune`` and as the scheduled
``reap-orphans`` deployment.

It only acts on what the Prefect API *says*: a swarm is stopped when every lease on it is dead
(a flow run in a terminal state — Completed, Failed, Cancelled, Crashed —, a process gone, a job
ended) and none is a KEEP lease; a swarm without leases (recorded before leases existed) when
the flow run that brought it up is terminal. When the API is unreachable, not
configured, or does not know the run, it does nothing destructive. Prefect is imported only
inside the query, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from prefect_swarm.exceptions import PrefectUnavailable
from prefect_swarm.holding import default_holding
from prefect_swarm.state import StateStore, SwarmRecord
from prefect_swarm.tasks.flow_runs import TERMINAL, flow_run_states

log = logging.getLogger("prefect_swarm.tasks.reaper")


def reap_orphans(store: StateStore | None = None, *, dry_run: bool = False, logger: Any = None) -> list[str]:
    """Stop every orphan swarm (:meth:`~prefect_swarm.holding.Holding.orphans`); return their names.
    Does nothing when Prefect cannot be asked.

    Messages go to ``logger`` (the run logger of the run doing it), else this module's logger.
    """
    say = logger or log
    hold = default_holding(store, strict=True)
    reaped = []
    try:
        for rec, leases in hold.orphans():
            if leases:
                dead = hold.gone(leases)
                if {x.owner for x in leases} - dead:
                    continue
                why = "its lease holders are gone: " + ", ".join(sorted(dead))
                if not dry_run:
                    _crash_dead_runs(dead, say)
            else:
                state = flow_run_states([str(rec.flow_run_id)]).get(str(rec.flow_run_id))
                if state not in TERMINAL:
                    continue
                why = f"its flow run {rec.flow_run_id} is {state}"
            say.warning("swarm '%s' outlived its users (%s): stopping it", rec.name, why)
            if not dry_run and not _stop(rec, hold.store, [x.owner for x in leases], say):
                continue
            if not dry_run:
                from prefect_swarm.tasks.events import swarm_event

                swarm_event("reaped", rec.name, source=rec.source, why=why)
            reaped.append(rec.name)
    except PrefectUnavailable as exc:
        say.warning("orphan reaper did nothing more: %s", exc)
    return reaped


def crash_task_runs(flow_run_id: str, *, why: str) -> list[str]:
    """Mark every task run of flow run ``flow_run_id`` that is not in a final state Crashed, through
    the API; return their names. A SIGKILLed flow process reports nothing for its tasks, so without
    this its shard task runs stay Running in the UI forever. Never raises: the UI's state is all
    this changes."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(flow_run_id)]))
            )
            open_runs = [t for t in runs if t.state is not None and not t.state.is_final()]
            for run in open_runs:
                client.set_task_run_state(run.id, Crashed(message=why), force=True)
    except Exception as exc:
        log.warning("could not mark the task runs of flow run %s Crashed: %s", flow_run_id, exc)
        return []
    return [t.name for t in open_runs]


def _crash_dead_runs(owners: set[str], say: Any) -> None:
    for owner in sorted(owners):
        if owner.startswith("flow-run:"):
            run_id = owner.removeprefix("flow-run:")
            names = crash_task_runs(run_id, why=f"flow run {run_id} ended without finishing this task run")
            if names:
                say.warning("flow run %s ended; marked its task runs Crashed: %s", run_id, ", ".join(names))


def _stop(rec: SwarmRecord, store: StateStore, owners: list[str], say: Any) -> bool:
    from prefect_swarm.tasks.swarm import cancel_flow_run_jobs, teardown_flow_run

    try:
        if not owners:
            teardown_flow_run(str(rec.flow_run_id), log=say)
            return True
        for owner in owners:
            if owner.startswith("flow-run:"):
                cancel_flow_run_jobs(owner.removeprefix("flow-run:"), store)
        default_holding(store, say=say.info, strict=True).release(rec.name, None)
    except Exception as exc:
        say.error("could not stop orphan swarm '%s': %s", rec.name, exc)
        return False
    return True


def reap_quietly() -> None:
    """Run the orphan reaper from inside a flow run; log (never raise) what it did, to the run's log."""
    from prefect import get_run_logger

    run_log = get_run_logger()
    try:
        reaped = reap_orphans(logger=run_log)
    except Exception as exc:
        run_log.warning("orphan reaper skipped: %s", exc)
        return
    if reaped:
        run_log.warning("Reaped orphan swarm(s) of ended flow runs: %s", ", ".join(reaped))
