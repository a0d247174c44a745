"""What every task shares: the per-run stop events, retry-by-type, the current run ids."""

from __future__ import annotations

import threading
from typing import Any

from prefect_swarm.exceptions import BackendError, CapacityError, ConfigError, JobError

_STOP_LOCK = threading.Lock()
_STOP_EVENTS: dict[str, threading.Event] = {}

RETRYABLE: tuple[type[BaseException], ...] = (
    CapacityError,
    BackendError,
    JobError,
    ConnectionError,
    TimeoutError,
)
"""Exceptions a task retries on. ConfigError (and DatasetError) never: the user must fix the input."""


def stop_event(flow_run_id: str | None = None) -> threading.Event:
    """The stop event of flow run ``flow_run_id`` (default: the current one).

    Module-level, keyed by flow run, so two flows in one process (tests, `run_job` inside a
    long-lived worker) cannot stop each other. The flow sets it in ``finally``; shard tasks
    poll in short steps and return as soon as it is set (Prefect never interrupts a running
    thread: without this a cancel waits the runner's 30 s grace, then SIGKILL).
    """
    key = flow_run_id or current_flow_run_id() or "-"
    with _STOP_LOCK:
        return _STOP_EVENTS.setdefault(key, threading.Event())


def release_stop_event(flow_run_id: str | None) -> None:
    """Forget a finished run's event (after setting it)."""
    with _STOP_LOCK:
        _STOP_EVENTS.pop(flow_run_id or "-", None)


def retry_on_type(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn``: retry transient failures (by exception type), never bad input, and
    never once the run is stopping (a cancel makes shards fail with JobError; retrying them would
    submit new work into a swarm being torn down)."""
    run_id = getattr(task_run, "flow_run_id", None)
    with _STOP_LOCK:
        event = _STOP_EVENTS.get(str(run_id)) if run_id else None
    if event is not None and event.is_set():
        return False
    try:
        state.result()
    except ConfigError:
        return False
    except RETRYABLE:
        return True
    except BaseException:
        return False
    return False


def current_flow_run_id() -> str | None:
    """Id of the flow run we are in, or None outside a flow."""
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else None


def current_task_run_id() -> str | None:
    """Id of the task run we are in, or None outside a task."""
    from prefect.runtime import task_run

    run_id = task_run.get_id()
    return str(run_id) if run_id else None
