"""What every task shares: the per-run stop events, retry-by-type, the current run ids, run tags."""

from __future__ import annotations

import contextvars
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect_swarm.exceptions import (
    REPORTED_AS_MESSAGE,
    BackendError,
    CapacityError,
    ConfigError,
    JobError,
)
from prefect_swarm.settings import get_settings

_STOP_LOCK = threading.Lock()
_STOP_EVENTS: dict[str, threading.Event] = {}
_STOPPED: deque[str] = deque(maxlen=256)
"""Runs whose body has ended, most recent last (bounded): their shards are never retried."""

RETRYABLE: tuple[type[BaseException], ...] = (
    CapacityError,
    BackendError,
    JobError,
    ConnectionError,
    TimeoutError,
)
"""Exceptions a task retries on. ConfigError (and DatasetError) never: the user must fix the input."""


def results_dir() -> Path:
    """Where shard task results (the Prefect cache) are persisted, and flow results by default."""
    return get_settings().home_dir / "prefect-results"


def flow_result_storage() -> str | Path:
    """Where a flow persists its result: the filesystem block ``PREFECT_SWARM_RESULT_STORAGE`` names
    (a slug such as ``local-file-system/NAME`` or ``s3-bucket/NAME``: any saved block Prefect can
    write results to; Prefect loads it when the run starts), else :func:`results_dir`.

    Read when the flow module is imported: a worker's flow run imports it afresh, so the work
    pool's ``result_storage`` job variable (or an ``env`` entry) applies per deployment or run.
    Shard caches stay in :func:`results_dir`, beside the ledgers they describe.
    """
    slug = (get_settings().result_storage or "").strip()
    if not slug:
        return results_dir()
    kind, _, name = slug.partition("/")
    if not kind or not name or "/" in name:
        raise ConfigError(
            f"PREFECT_SWARM_RESULT_STORAGE={slug!r} is not a block slug: give 'BLOCK-TYPE/NAME' of a saved "
            "filesystem block, e.g. 'local-file-system/results' or 's3-bucket/results' (`prefect block ls`)."
        )
    return slug


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


@contextmanager
def run_stop_event() -> Iterator[threading.Event]:
    """The current run's stop event for the body of a flow: set when the body ends, however it ends
    (shard tasks still polling see it and cancel their processes), then forgotten, so a long-lived
    worker does not keep one event per run it ever ran."""
    key = current_flow_run_id() or "-"
    event = stop_event(key)
    try:
        yield event
    finally:
        event.set()
        with _STOP_LOCK:
            _STOPPED.append(key)
            if _STOP_EVENTS.get(key) is event:
                del _STOP_EVENTS[key]


@contextmanager
def repeating(every_s: float, step: Callable[[], None]) -> Iterator[None]:
    """Call ``step`` every ``every_s`` seconds from a thread in the current run's context (its logger
    and client work there) while the block runs; ``step`` handles its own errors. The thread is
    stopped and joined when the block ends (a step under way is waited for)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            step()

    thread = threading.Thread(target=contextvars.copy_context().run, args=(loop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=max(every_s, 10.0))


def signal_stop(flow_run_id: str) -> None:
    """Set flow run ``flow_run_id``'s stop event if it still has one (a cancel/crash hook); never creates one."""
    with _STOP_LOCK:
        event = _STOP_EVENTS.get(flow_run_id)
    if event is not None:
        event.set()


def retry_on_type(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn``: retry transient failures (by exception type), never bad input, and
    never once the run is stopping (a cancel makes shards fail with JobError; retrying them would
    submit new work into a swarm being torn down)."""
    run_id = getattr(task_run, "flow_run_id", None)
    with _STOP_LOCK:
        event = _STOP_EVENTS.get(str(run_id)) if run_id else None
        ended = run_id is not None and str(run_id) in _STOPPED
    if ended or (event is not None and event.is_set()):
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


def label_run(swarm_name: str, job_id: str | None) -> None:
    """Tag the current flow run ``swarm:<name>`` and ``job:<id>`` (``history`` joins on these).

    Only the flow run: its task runs carry no tags on purpose. Prefect takes a concurrency lease
    on the API for every tag of every task run (a write at its start and one at its end, 64 shards
    at once), and on a SQLite Prefect server that write collides with the server's own (503,
    "database is locked"), which the client retries only after about 2 s.
    """
    tag_run(f"swarm:{swarm_name}", *([f"job:{job_id}"] if job_id else []))


def tag_run(*wanted: str) -> None:
    """Add ``wanted`` to the current flow run's tags (as the API has them now)."""
    from prefect import get_client, get_run_logger

    run_id = current_flow_run_id()
    if run_id is None or not wanted:
        return
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(uuid.UUID(run_id)).tags or []
            client.update_flow_run(uuid.UUID(run_id), tags=sorted({*current, *wanted}))
    except Exception as exc:  # labels are for history only; never fail a run for them
        get_run_logger().warning("could not tag flow run %s: %s", run_id, exc)


def run_logger(fallback: str = "prefect_swarm.tasks") -> Any:
    """The current run's logger (its messages reach that run's logs in the UI); outside a run,
    the plain logger ``fallback``."""
    import logging

    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(fallback)


RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
"""Prefect's loggers of flow and task runs (the lines the UI shows for a run)."""


class _MessageOnly(logging.Filter):
    """Drop the traceback from a run's log record whose error is not a bug (REPORTED_AS_MESSAGE):
    Prefect logs every failed task and flow with ``exc_info``; for a missing input file that is two
    full tracebacks in the UI around one sentence. The line itself (with the error) stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, REPORTED_AS_MESSAGE):
            record.exc_info, record.exc_text = None, None
        return True


STOPPED_FROM_OUTSIDE = "Finished in state Running()"
"""Prefect's last line of a flow process its worker cancelled: the engine leaves the state to the worker
(which sets Cancelled) and logs the state it last saw itself, Running."""


class _TrueFinish(logging.Filter):
    """Say what a flow run's last line from its own process means when the worker cancelled it
    (:data:`STOPPED_FROM_OUTSIDE`): the run is not Running; the worker ends it Cancelled and its
    teardown hook logs the final state with what it stopped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() == STOPPED_FROM_OUTSIDE:
            record.msg, record.args = "Flow process stopped: the run was cancelled (the worker ends it Cancelled).", ()
        return True


def quiet_user_errors() -> None:
    """Install :class:`_MessageOnly` on Prefect's run loggers, and :class:`_TrueFinish` on the flow runs'
    (once; Prefect's logging setup keeps a logger's filters). Done when the tasks are imported, so every
    flow using them has it."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _MessageOnly) for f in logger.filters):
            logger.addFilter(_MessageOnly())
    flows = logging.getLogger(RUN_LOGGERS[0])
    if not any(isinstance(f, _TrueFinish) for f in flows.filters):
        flows.addFilter(_TrueFinish())


def failed_run(exc: BaseException) -> Any:
    """What a flow returns for an error that is not a bug (REPORTED_AS_MESSAGE): a Failed state whose
    message is the error's own (naming the field or file and what to do), without the traceback
    Prefect would log for a raised one. Calling the flow in Python still raises ``exc``."""
    from prefect.states import Failed

    return Failed(message=str(exc), data=exc)


quiet_user_errors()
