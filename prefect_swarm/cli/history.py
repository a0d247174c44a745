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
