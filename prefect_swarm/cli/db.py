"""``prefect-swarm db``: housekeeping of the state database."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer

from prefect_swarm.cli.output import OutputFormat, console, emit_json, err_console, table
from prefect_swarm.cli.swarms import OutputOpt, YesOpt, confirm
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore, SwarmRecord

log = logging.getLogger("prefect_swarm.cli")

db_app = typer.Typer(help="Housekeeping of the state database ($PREFECT_SWARM_HOME/state.db).", no_args_is_help=True)


def certainly_gone(rec: SwarmRecord, store: StateStore) -> tuple[bool, str]:
    """Whether swarm ``rec`` is certainly stopped, and why we think so.

    Only two facts count: the record says STOPPED, or the backend answers that it is STOPPED. A
    probe that errors or answers UNKNOWN proves nothing, so the record is kept.
    """
    if rec.phase is ServingPhase.STOPPED:
        return True, "recorded as STOPPED"
    if not rec.handle:
        return False, f"recorded {rec.phase} with no backend handle; cannot ask the backend"
    try:
        phase = default_holding(store).attach(rec.name).status().phase
    except Exception as exc:  # "could not tell" is never "gone"
        return False, f"could not ask the {rec.backend} backend ({type(exc).__name__}: {exc})"
    if phase is ServingPhase.STOPPED:
        return True, "the backend reports STOPPED"
    return False, f"the backend reports {phase.value}"


def run_reaper(dry_run: bool = False) -> Any:
    """Run the orphan reaper (it stops swarms whose flow run died) before pruning, so what it stops is
    pruned in the same pass; its failure is logged, never fatal here."""
    from prefect_swarm.tasks.reaper import reap_orphans

    try:
        return reap_orphans(dry_run=dry_run)
    except Exception as exc:  # pruning is conservative on its own; go on without the reaper
        log.warning("the orphan reaper failed: %s", exc)
        return None


@db_app.command("prune")
def prune(
    yes: YesOpt = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be removed; remove nothing.")] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Remove records of swarms that are certainly gone (STOPPED); keep any whose state is unsure."""
    reaped = run_reaper(dry_run)
    store = StateStore()
    remove: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    for rec in store.list_swarms():
        gone, why = certainly_gone(rec, store)
        (remove if gone else kept).append((rec.name, why))
    if output is OutputFormat.table:
        _show(remove, kept)
    if remove and not dry_run:
        confirm(f"Remove {len(remove)} record(s)?", yes)
        for name, _why in remove:
            store.delete_swarm(name)
    if output is OutputFormat.json:
        emit_json(
            {
                "dry_run": dry_run,
                "reaped": reaped,
                "removed": [{"name": n, "reason": w} for n, w in remove],
                "kept": [{"name": n, "reason": w} for n, w in kept],
            }
        )


def _show(remove: list[tuple[str, str]], kept: list[tuple[str, str]]) -> None:
    if remove:
        console.print(table("records to remove", ["name", "why"], remove))
    else:
        err_console.print("no records to remove.")
    if kept:
        console.print(table("records kept", ["name", "why"], kept))
