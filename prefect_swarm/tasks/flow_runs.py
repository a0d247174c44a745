"""Prefect's word on flow runs: whether the API answers, the state of runs, which have ended, a swarm's
run history. The reaper, the holding of a swarm and the CLI's views read it here. Prefect is imported
only inside each call, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from prefect_swarm.exceptions import PrefectUnavailable
from prefect_swarm.settings import get_settings

log = logging.getLogger("prefect_swarm.tasks.reaper")

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
"""Prefect state types after which a flow run will never tear its swarm down itself."""


def _in_flow_run() -> bool:
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def api_url() -> str | None:
    """The configured Prefect API URL (``PREFECT_API_URL`` / profile), or None."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def check_api(timeout_s: float | None = None) -> str:
    """Raise PrefectUnavailable unless the API answers ``/health`` within ``timeout_s``; return its URL."""
    import httpx

    from prefect_swarm.interfaces.readiness import http_client

    url = api_url()
    if url is None:
        raise PrefectUnavailable("no Prefect API configured (PREFECT_API_URL is unset)")
    timeout = timeout_s or get_settings().prefect_api_timeout_s
    try:
        resp = http_client().get(url.rstrip("/") + "/health", timeout=timeout)
    except httpx.HTTPError as exc:
        raise PrefectUnavailable(f"Prefect API at {url} is unreachable ({type(exc).__name__})") from None
    if resp.status_code != 200:
        raise PrefectUnavailable(f"Prefect API at {url} answered HTTP {resp.status_code} to /health")
    return url


def flow_run_states(run_ids: list[str]) -> dict[str, str]:
    """State type (``COMPLETED``...) of each flow run the API knows; raise PrefectUnavailable."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    if not _in_flow_run():
        check_api()
    ids = []
    for rid in run_ids:
        try:
            ids.append(uuid.UUID(rid))
        except ValueError:
            continue
    if not ids:
        return {}
    try:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=len(ids))
    except Exception as exc:
        raise PrefectUnavailable(f"reading flow runs failed: {type(exc).__name__}: {exc}") from None
    return {str(r.id): r.state.type.value for r in runs if r.state is not None}


def terminal_runs(run_ids: list[str]) -> dict[str, bool]:
    """Whether each flow run among ``run_ids`` that Prefect knows has ended (the
    :data:`~prefect_swarm.holding.TerminalRuns` of the Prefect layer); none when it cannot be asked
    (their leases are then judged by their processes)."""
    try:
        states = flow_run_states(run_ids)
    except PrefectUnavailable as exc:
        log.warning("cannot ask whether flow runs ended (%s): their leases are judged by their processes.", exc)
        return {}
    return {rid: state in TERMINAL for rid, state in states.items()}


def strict_terminal_runs(run_ids: list[str]) -> dict[str, bool]:
    states = flow_run_states(run_ids)  # PrefectUnavailable goes up: the reaper then does nothing
    return {rid: state in TERMINAL for rid, state in states.items()}


def runs_for_swarm(name: str, limit: int = 20) -> list[dict[str, Any]]:
    """Flow runs tagged ``swarm:<name>``, newest first: id, name, flow, state, start, duration, tags.

    Raises :class:`~prefect_swarm.exceptions.PrefectUnavailable` (one-line message) when the Prefect
    API is not configured or does not answer within ``PREFECT_SWARM_PREFECT_API_TIMEOUT_S``.
    """
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    check_api()
    try:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"swarm:{name}"])),
                sort=FlowRunSort.START_TIME_DESC,
                limit=limit,
            )
            flows = {f.id: f.name for f in client.read_flows(limit=200)} if runs else {}
    except Exception as exc:
        raise PrefectUnavailable(f"reading Prefect run history failed: {type(exc).__name__}: {exc}") from None
    return [_row(r, flows) for r in runs]


def _row(run: Any, flows: dict[Any, str]) -> dict[str, Any]:
    duration = run.total_run_time.total_seconds() if run.total_run_time else None
    if run.start_time and run.end_time:
        duration = (run.end_time - run.start_time).total_seconds()
    return {
        "flow_run_id": str(run.id),
        "flow_run_name": run.name,
        "flow": flows.get(run.flow_id),
        "state": run.state.name if run.state else None,
        "state_type": run.state.type.value if run.state else None,
        "start": run.start_time.isoformat(timespec="seconds") if run.start_time else None,
        "duration_s": round(duration, 1) if duration is not None else None,
        "tags": sorted(run.tags or []),
    }
