"""``prefect-swarm automations install``: the heartbeat zombie automation on the Prefect server.

A SIGKILLed (or OOM-killed, or node-lost) flow process sends nothing; without this automation its
run stays Running forever and the reaper, which trusts only terminal states, cannot reap its swarm.
Self-hosted Prefect has no built-in zombie detection, so this creates the automation from the
Prefect docs ("detect zombie flows"), scoped to this package: a flow run tagged ``prefect-swarm``
(every deployment in ``deployments/prefect.yaml`` carries the tag, and its runs inherit it) whose
heartbeats stop for ``--within`` seconds is marked Crashed, and the Crashed event triggers the
reaper. Other flows of the workspace are never touched, and a run that already ended keeps its
state (the change is not forced). Heartbeats must be on in the flow
process: ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` (>= 30 s; ``deployments/prefect.yaml`` sets 30),
well below ``--within``.

Prefect is imported only when the command runs, so the rest of the CLI starts without it.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Annotated, Any

import typer

from prefect_swarm.cli.output import OutputFormat, console, emit_json
from prefect_swarm.exceptions import BackendError

ZOMBIE_AUTOMATION = "prefect-swarm-crash-zombie-flows"
"""Name of the automation; installing again replaces it."""

SCOPE_TAG = "prefect-swarm"
"""The tag every deployment in ``deployments/prefect.yaml`` carries (its runs inherit it): the
zombie automation watches only flow runs with it, never the rest of the workspace."""

automations_app = typer.Typer(help="Prefect automations prefect-swarm relies on.", no_args_is_help=True)


def zombie_automation(within_s: float = 90.0) -> Any:
    """The automation object (not yet created): a flow run tagged ``prefect-swarm`` with no
    heartbeat for ``within_s`` -> Crashed. Not forced: a run that already ended (a last heartbeat
    can arrive after its Completed event) keeps its state, the server refuses the change. A run
    that suspends or pauses stops its heartbeats on purpose: entering those states counts as the
    expected event, so such a run is left alone until it runs (and beats) again."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    ends = ("Completed", "Failed", "Cancelled", "Crashed")
    quiet = ("Suspended", "Paused")  # no heartbeats while in them, by design
    return Automation(
        name=ZOMBIE_AUTOMATION,
        description=f"Marks flow runs tagged {SCOPE_TAG!r} Crashed when their heartbeats stop; the reaper then "
        "stops their swarms.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in (*ends, *quiet))},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{SCOPE_TAG}"}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[
            ChangeFlowRunState(  # type: ignore[call-arg]  # name/force have defaults at runtime
                state=StateType.CRASHED,
                message="no heartbeat: marked Crashed by the prefect-swarm zombie automation",
                force=False,
            )
        ],
    )


def ensure_zombie_automation(within_s: float = 90.0) -> str:
    """Create (or replace) the zombie automation on the configured Prefect API; return its id."""
    from prefect.automations import Automation

    from prefect_swarm.exceptions import PrefectUnavailable
    from prefect_swarm.tasks.flow_runs import check_api

    try:
        check_api()
    except PrefectUnavailable as exc:
        raise BackendError(
            f"cannot install the zombie automation: {exc}.",
            hint="start a Prefect server (`prefect server start`) and set PREFECT_API_URL to its /api URL.",
        ) from None
    with contextlib.suppress(ValueError):
        Automation.read(name=ZOMBIE_AUTOMATION).delete()  # type: ignore[attr-defined]  # sync dispatch
    return str(zombie_automation(within_s).create().id)


@automations_app.command("install")
def install(
    within: Annotated[
        float, typer.Option("--within", min=1, help="Seconds without a heartbeat before a flow run is Crashed.")
    ] = 90.0,
    output: Annotated[OutputFormat, typer.Option("--output", "-o")] = OutputFormat.table,
) -> None:
    """Create (or replace) the zombie automation: a flow run silent for --within seconds is marked Crashed."""
    automation_id = ensure_zombie_automation(within)
    if output is OutputFormat.json:
        emit_json({"name": ZOMBIE_AUTOMATION, "id": automation_id, "within_s": within})
    else:
        console.print(f"zombie automation {ZOMBIE_AUTOMATION!r}: {automation_id} (within {within:g} s)")
