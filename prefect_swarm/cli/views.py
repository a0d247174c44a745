"""What the CLI shows about a swarm: its record, its live status, its paths, its Prefect history.

Pure data (dicts that become JSON or tables); nothing here prints.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Any

from prefect_swarm.cli.output import iso
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.interfaces.usage import GpuUsage
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.settings import get_settings
from prefect_swarm.state import JobRecord, StateStore, SwarmRecord
from prefect_swarm.swarm import Swarm

log = logging.getLogger("prefect_swarm.cli")


def record_view(rec: SwarmRecord) -> dict[str, Any]:
    """The stored facts about a swarm (stable keys)."""
    handle = rec.handle or {}
    return {
        "name": rec.name,
        "backend": rec.backend,
        "phase": rec.phase.value,
        "model": rec.config.get("served_model_name") or rec.config.get("model"),
        "replicas": rec.config.get("replicas"),
        "endpoint": None if rec.phase in (ServingPhase.STOPPED, ServingPhase.PARKED) else handle.get("url"),
        "keep": rec.keep,
        "flow_run_id": rec.flow_run_id,
        "fingerprint": rec.fingerprint,
        "created_at": iso(rec.created_at),
        "updated_at": iso(rec.updated_at),
    }


def job_view(rec: JobRecord) -> dict[str, Any]:
    """The stored facts about a job (stable keys), the same whoever submitted it (CLI or flow run)."""
    subs = rec.submissions
    progress = rec.progress or {}
    return {
        "id": rec.id,
        "swarm": rec.swarm,
        "status": rec.status.value,
        "kind": "batch" if "input" in rec.spec else "script",
        "nshards": rec.nshards,
        "done": progress.get("done"),
        "failed": progress.get("failed"),
        "total": progress.get("total"),
        "submissions": [
            {
                "id": s.get("id"),
                "backend": s.get("backend"),
                "shards": s.get("shards"),
                "task_run_id": s.get("task_run_id"),
            }
            for s in subs
        ],
        "flow_run_id": rec.flow_run_id,
        "job_dir": rec.job_dir,
        "output": rec.spec.get("output"),
        "created_at": iso(rec.created_at),
        "updated_at": iso(rec.updated_at),
    }


def live_status(rec: SwarmRecord, store: StateStore) -> dict[str, Any]:
    """Ask the backend how the swarm is now. Never raises: a failed look is phase UNKNOWN with why."""
    unknown: dict[str, Any] = {
        "phase": ServingPhase.UNKNOWN.value,
        "url": None,
        "healthy_replicas": 0,
        "replicas": [],
    }
    if not rec.handle:
        return {
            **unknown,
            "phase": rec.phase,
            "detail": "no backend handle recorded (bring-up never submitted)",
        }
    try:
        swarm = default_holding(store).attach(rec.name)
        status = swarm.status()
        if status.phase is ServingPhase.PARKED and rec.phase is ServingPhase.RUNNING:
            store.settle_phase(rec, ServingPhase.PARKED)  # it parked itself (idle): record what was seen
        return {**status.to_dict(), "cost": cost_view(swarm, store)}
    except Exception as exc:  # a status look must not fail the command: it reports what it could not see
        log.debug("status of %s failed", rec.name, exc_info=True)
        return {**unknown, "detail": f"could not ask the {rec.backend} backend: {type(exc).__name__}: {exc}"}


def cost_view(swarm: Swarm, store: StateStore) -> dict[str, Any]:
    """The swarm's GPU-hours (the backend's best source), priced by ``backend.cost``, per million tokens
    of its jobs. Never raises: a source that failed gives null figures and the reason."""
    tokens = sum(
        int((j.progress or {}).get("prompt_tokens") or 0) + int((j.progress or {}).get("completion_tokens") or 0)
        for j in store.list_jobs(swarm.cfg.name)
    )
    try:
        usage = swarm.backends.serving.gpu_usage(swarm.handle) if swarm.handle else None
    except Exception as exc:  # sacct down, API error: the status still prints
        usage = GpuUsage(None, "n/a", reason=f"{type(exc).__name__}: {exc}".splitlines()[0])
    usage = usage or GpuUsage(None, "n/a", reason="no backend handle recorded")
    figures = swarm.cfg.backend.cost.figures(usage.gpu_hours, tokens, usage.shape)
    return {**figures, "tokens": tokens, "source": usage.source, "gpus": usage.gpus, "reason": usage.reason}


def cost_text(cost: dict[str, Any] | None) -> str | None:
    """One line for the text tables: GPU-hours, and USD (per million tokens) when priced; None without figures."""
    if not cost:
        return None
    hours = cost.get("gpu_hours")
    if hours is None:
        return f"cost: n/a ({cost.get('reason') or 'no GPU-hour figure'})"
    text = f"cost: {hours:.4g} GPU-hours"
    if cost.get("usd") is not None:
        text += f", ${cost['usd']:.4g}"
        if cost.get("usd_per_million_tokens") is not None:
            text += f" (${cost['usd_per_million_tokens']:.4g}/M tokens)"
    else:
        text += " (no price: set backend.cost.gpu_hour_usd)"
    text += f", from {cost['source']}" if cost.get("source") else ""
    budget = cost.get("budget") or {}
    if budget.get("text"):
        held = f" (${budget['reserved_usd']:.4g} still reserved)" if budget.get("reserved_usd") else ""
        text += f"\nbudget: {budget['text']}{held}; {budget.get('rows_left', 0):,} rows left"
    return text


def paths_view(rec: SwarmRecord) -> dict[str, Any]:
    """Files of the swarm on this machine."""
    paths = SwarmPaths.of(rec.name, rec.run_dir)
    replicas = int(rec.config.get("replicas") or 0)
    return {
        "root": str(paths.root),
        "exists": paths.root.exists(),
        "config": str(paths.config),
        "replicas": [
            {
                "index": i,
                "log": str(paths.replica_log(i)),
                "status": str(paths.replica_status(i)),
                "head": str(paths.replica_head(i)),
                "watchdog_log": str(paths.watchdog_log(i)),
            }
            for i in range(replicas)
        ],
    }


_ABANDONED: list[threading.Thread] = []


def lookup_abandoned() -> bool:
    """True while a Prefect lookup given up on by :func:`prefect_history` still runs in its thread.

    Such a thread may sit in a blocking socket call of the Prefect client; the interpreter's shutdown
    would then abort the process ("FATAL: exception not rethrown", SIGABRT) after the output was
    written. The console script (``prefect_swarm.cli.main.run``) ends the process at once instead.
    """
    return any(t.is_alive() for t in _ABANDONED)


def prefect_history(name: str, limit: int = 20) -> dict[str, Any]:
    """Prefect runs of swarm ``name``: ``{available, runs, error}``; never raises, never hangs.

    ``available`` is False when the runs could not be read; ``error`` then says why (the Prefect
    API is unreachable, or took longer than the settings' timeout).
    """
    from prefect_swarm.tasks.flow_runs import runs_for_swarm  # imports Prefect only when it is called

    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["runs"] = runs_for_swarm(name, limit)
        except Exception as exc:  # whatever the Prefect client raises: shown as one line
            result["error"] = f"{type(exc).__name__}: {exc}"

    # a daemon thread, so a hung API call cannot block the command; one left behind is recorded so
    # the console script ends the process without finalizing it (see ``lookup_abandoned``)
    # (run in a copy of this context: the caller's Prefect settings, e.g. temporary_settings, hold there)
    worker = threading.Thread(target=contextvars.copy_context().run, args=(call,), daemon=True, name="prefect-history")
    worker.start()
    timeout = get_settings().prefect_api_timeout_s + 1.0
    worker.join(timeout)
    if worker.is_alive():
        _ABANDONED.append(worker)
        result["error"] = f"timed out after {timeout:g} s"
    if "error" in result:
        return {"available": False, "runs": [], "error": f"Prefect API unreachable ({result['error']})"}
    return {"available": True, "runs": result.get("runs", []), "error": None}
