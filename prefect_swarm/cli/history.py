"""``prefect-swarm history [NAME]``: the Prefect runs of a swarm beside its SQLite record.

SQLite says what exists; Prefect's run history says what ran, when, with what result. They are
joined by the ``swarm:<name>`` tag every flow puts on its run. When the Prefect API is
unreachable the command says so in one line and still shows SQLite.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from prefect_swarm.cli.output import OutputFormat, console, emit_json, iso, table
from prefect_swarm.cli.views import job_view, prefect_history
from prefect_swarm.state import StateStore
from prefect_swarm.tasks.reaper import PrefectUnavailable, check_api


def runs_for_swarm(name: str, limit: int = 20) -> list[dict[str, Any]]:
    """Flow runs tagged ``swarm:<name>``, newest first: id, name, flow, state, start, duration, tags.

    Raises :class:`prefect_swarm.tasks.reaper.PrefectUnavailable` (one-line message) when the Prefect
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


def history_cmd(
    name: Annotated[str | None, typer.Argument(help="Swarm name; default: every swarm in the state database.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Most runs shown per swarm.")] = 20,
    output: Annotated[OutputFormat, typer.Option("--output", "-o", help="table or json.")] = OutputFormat.table,
) -> None:
    """Show each swarm's SQLite record and the Prefect flow runs tagged with it (state, start, duration)."""
    store = StateStore()
    records = [store.require_swarm(name)] if name else store.list_swarms()
    problem: str | None = None
    runs: dict[str, list[dict[str, Any]]] = {}
    for rec in records:  # each lookup bounded by PREFECT_SWARM_PREFECT_API_TIMEOUT_S; the first failure ends them
        found = prefect_history(rec.name, limit) if problem is None else {"runs": [], "error": None}
        runs[rec.name], problem = found["runs"], problem or found["error"]
    if output is OutputFormat.json:
        emit_json(
            {
                "swarms": [
                    {
                        "name": r.name,
                        "phase": r.phase.value,
                        "backend": r.backend,
                        "flow_run_id": r.flow_run_id,
                        "keep": r.keep,
                        "updated_at": iso(r.updated_at),
                        "runs": runs[r.name],
                        "jobs": [job_view(j) for j in store.list_jobs(r.name)],
                    }
                    for r in records
                ],
                "prefect_error": problem,
            }
        )
        return
    if problem:
        console.print(f"Prefect run history unavailable: {problem}; showing SQLite only.")
    for rec in records:
        console.print(
            table(
                f"swarm {rec.name}: {rec.phase} on {rec.backend}"
                f"{' (kept)' if rec.keep else ''}, flow run {rec.flow_run_id or '-'}, "
                f"updated {iso(rec.updated_at)}",
                ["flow run", "flow", "state", "start", "duration s", "id"],
                [
                    [r["flow_run_name"], r["flow"], r["state"], r["start"], r["duration_s"], r["flow_run_id"]]
                    for r in runs[rec.name]
                ],
            )
        )
        jobs = [job_view(j) for j in store.list_jobs(rec.name)]
        if jobs:
            cols = ["id", "status", "done", "failed", "total", "flow_run_id", "created_at"]
            console.print(table(f"jobs of {rec.name}", cols, [[j[c] for c in cols] for j in jobs]))
    if not records:
        console.print("No swarms in the state database.")
