"""State hooks that tear a flow run's swarms down (and its subflow runs') when it is cancelled or crashes.

With a worker, Prefect runs these hooks in the worker process (not the flow process, which may
be gone), so they find everything from SQLite by flow run id; the flow run's own
``PREFECT_SWARM_HOME`` (from its job variables) is honoured. Idempotent: the flow's ``finally``
usually got there first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect_swarm.interfaces import jobenv
from prefect_swarm.tasks._common import signal_stop
from prefect_swarm.tasks.reaper import crash_task_runs
from prefect_swarm.tasks.swarm import teardown_flow_run

log = logging.getLogger("prefect_swarm.flows")


@contextmanager
def _swarm_home_of(flow_run: Any) -> Iterator[None]:
    env = (getattr(flow_run, "job_variables", None) or {}).get("env") or {}
    home = env.get(jobenv.HOME)
    old = jobenv.env_value(jobenv.HOME)
    if home:
        os.environ[jobenv.HOME] = home
    try:
        yield
    finally:
        if home and old is not None:
            os.environ[jobenv.HOME] = old
        elif home:
            os.environ.pop(jobenv.HOME, None)


def teardown_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_cancellation`` / ``on_crashed``: stop shard polling, cancel jobs, stop owned swarms; on a
    crash, mark the run's unfinished task runs Crashed."""
    from prefect.logging.loggers import flow_run_logger

    run_id = str(flow_run.id)
    signal_stop(run_id)
    run_log = flow_run_logger(flow_run, flow)  # the run's own logs, also from the worker process
    if state.is_crashed():  # a dead flow process reported nothing for its task runs
        crashed = crash_task_runs(run_id, why=f"flow run {run_id} crashed ({state.message or state.name})")
        if crashed:
            run_log.warning("marked task runs Crashed: %s", ", ".join(crashed))
    try:
        with _swarm_home_of(flow_run):
            stopped = teardown_flow_run(run_id, log=run_log)
            for child in subflow_runs(run_id):  # they died with this run's process; no hook of theirs runs
                signal_stop(child)
                stopped += teardown_flow_run(child, log=run_log)
                _end_like_parent(child, run_id, state)
    except Exception:  # a hook must not raise: the reaper retries later
        run_log.exception("teardown of flow run %s failed; `prefect-swarm db prune` reaps it later", run_id)
        return
    # the run's last line: its final state (a cancel hook sees Cancelling; the run ends Cancelled) and
    # what the teardown stopped (the flow's own ``finally`` may have let go of everything before)
    ended = "Cancelled" if state.is_cancelling() or state.is_cancelled() else state.name
    run_log.warning("Flow run %s ended %s: %s", run_id, ended, stopped.text())


def subflow_runs(flow_run_id: str) -> list[str]:
    """Ids of the flow runs started inside flow run ``flow_run_id`` (its subflows, theirs, ...) that
    have not ended: a pipeline's stages, a ``run_job`` called from a flow of your own. They run in
    its process, so a cancel or a crash of it ends them too, and none of their hooks runs."""
    import uuid

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    seen: set[str] = set()
    running: list[str] = []
    parents = [flow_run_id]
    with get_client(sync_client=True) as client:
        while parents:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[uuid.UUID(p) for p in parents])
                )
            )
            new = [r for r in runs if str(r.id) not in seen]
            seen.update(str(r.id) for r in new)
            running += [str(r.id) for r in new if r.state is None or not r.state.is_final()]
            parents = [str(r.id) for r in new]
    return running


def _end_like_parent(child: str, parent: str, state: Any) -> None:
    """Put subflow run ``child`` (and its open task runs) in its parent's final state (Crashed or
    Cancelled): its process is gone, nobody else reports for it. Never raises."""
    import uuid

    from prefect import get_client
    from prefect.states import Cancelled, Crashed

    why = f"its parent flow run {parent} ended {state.name}"
    try:
        crash_task_runs(child, why=why)
        end: Any = Crashed(message=why) if state.is_crashed() else Cancelled(message=why)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(uuid.UUID(child), end, force=True)
    except Exception as exc:  # the UI's state is all this changes
        log.warning("could not end subflow run %s: %s", child, exc)
