"""The orphan reaper: stop swarms whose flow run has ended, unless they were asked to be kept.

A SIGKILLed flow runs no ``finally`` and no hook; once Prefect marks its run terminal (the
heartbeat zombie automation turns a silent run Crashed) the swarm it owned is an orphan. The
reaper runs at the start of every flow, in ``prefect-swarm db prune`` and as the scheduled
``reap-orphans`` deployment.

It only acts on what the Prefect API *says*: a swarm is stopped when its flow run is in a
terminal state (Completed, Failed, Cancelled, Crashed). When the API is unreachable, not
configured, or does not know the run, it does nothing destructive. Prefect is imported only
inside the query, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import uuid

from prefect_swarm.settings import get_settings
from prefect_swarm.state import StateStore, SwarmRecord

log = logging.getLogger("prefect_swarm.tasks.reaper")

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
"""Prefect state types after which a flow run will never tear its swarm down itself."""


class PrefectUnavailable(Exception):
    """The Prefect API could not be asked (down, not configured); nothing was done."""


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

    url = api_url()
    if url is None:
        raise PrefectUnavailable("no Prefect API configured (PREFECT_API_URL is unset)")
    timeout = timeout_s or get_settings().prefect_api_timeout_s
    try:
        resp = httpx.get(url.rstrip("/") + "/health", timeout=timeout)
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


def orphan_candidates(store: StateStore) -> list[SwarmRecord]:
    """Live, not-kept swarms that a flow run brought up."""
    from prefect_swarm.swarm import LIVE_PHASES

    return [r for r in store.list_swarms() if r.phase in LIVE_PHASES and r.flow_run_id and not r.keep]


def reap_orphans(store: StateStore | None = None, *, dry_run: bool = False) -> list[str]:
    """Stop every orphan swarm; return their names. Does nothing when Prefect cannot be asked."""
    store = store or StateStore()
    candidates = orphan_candidates(store)
    if not candidates:
        return []
    try:
        states = flow_run_states([str(r.flow_run_id) for r in candidates])
    except PrefectUnavailable as exc:
        log.warning("orphan reaper did nothing: %s", exc)
        return []
    reaped = []
    for rec in candidates:
        state = states.get(str(rec.flow_run_id))
        if state not in TERMINAL:
            continue
        log.warning("swarm '%s' outlived its flow run %s (%s): stopping it", rec.name, rec.flow_run_id, state)
        if not dry_run and not _stop(rec, store):
            continue
        reaped.append(rec.name)
    return reaped


def _stop(rec: SwarmRecord, store: StateStore) -> bool:
    from prefect_swarm.tasks.swarm import teardown_flow_run

    try:
        teardown_flow_run(str(rec.flow_run_id))
    except Exception as exc:
        log.error("could not stop orphan swarm '%s': %s", rec.name, exc)
        return False
    return True


def reap_quietly() -> None:
    """Run the orphan reaper from inside a flow run; log (never raise) what it did."""
    from prefect import get_run_logger

    try:
        reaped = reap_orphans()
    except Exception as exc:
        get_run_logger().warning("orphan reaper skipped: %s", exc)
        return
    if reaped:
        get_run_logger().warning("Reaped orphan swarm(s) of ended flow runs: %s", ", ".join(reaped))
