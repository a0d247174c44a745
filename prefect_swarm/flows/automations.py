"""The heartbeat zombie automation: mark a flow run Crashed when its heartbeats stop.

A SIGKILLed (or OOM-killed, or node-lost) flow process sends nothing; without this its run stays
Running forever and the reaper, which trusts only terminal states, cannot reap its swarm.
Self-hosted Prefect has no built-in zombie detection, so we create the automation from the
Prefect docs ("detect zombie flows"). Heartbeats must be on in the flow process:
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` (>= 30 s; the deployments set 30) and ``within`` well above it.

    python -m prefect_swarm.flows.automations [--within 90]     # idempotent: replaces it
"""

from __future__ import annotations

import argparse
import contextlib
from datetime import timedelta

ZOMBIE_AUTOMATION = "prefect-swarm-crash-zombie-flows"


def zombie_automation(within_s: float = 90.0):  # type: ignore[no-untyped-def]
    """The automation object (not yet created)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=ZOMBIE_AUTOMATION,
        description="Marks flow runs Crashed when their heartbeats stop (prefect-swarm); the reaper then "
        "stops their swarms.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[
            ChangeFlowRunState(  # type: ignore[call-arg]  # name/force have defaults at runtime
                state=StateType.CRASHED,
                message="no heartbeat: marked Crashed by the prefect-swarm zombie automation",
            )
        ],
    )


def ensure_zombie_automation(within_s: float = 90.0) -> str:
    """Create (or replace) the zombie automation; return its id."""
    from prefect.automations import Automation

    with contextlib.suppress(ValueError):
        Automation.read(name=ZOMBIE_AUTOMATION).delete()  # type: ignore[attr-defined]  # sync dispatch
    return str(zombie_automation(within_s).create().id)


def main(argv: list[str] | None = None) -> None:
    """CLI: create the automation against the configured Prefect API."""
    ap = argparse.ArgumentParser(prog="python -m prefect_swarm.flows.automations", description=__doc__)
    ap.add_argument("--within", type=float, default=90.0, help="seconds without a heartbeat before Crashed")
    args = ap.parse_args(argv)
    print(f"zombie automation {ZOMBIE_AUTOMATION!r}: {ensure_zombie_automation(args.within)}")


if __name__ == "__main__":
    main()
