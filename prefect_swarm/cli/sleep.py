"""``prefect-swarm sleep NAME`` and ``prefect-swarm wake NAME``: replicas that free their GPUs and keep
their allocation (vLLM's sleep mode; the swarm needs ``engine.sleep_mode: true``).

A sleeping replica leaves the load balancer and the endpoints of the swarm's jobs first (a job running
across a sleep and a wake loses no row: its requests go to the replicas awake), then its engine frees
its GPU memory; ``wake`` brings it back once it answers again. A backend that cannot (Lepton, an
external endpoint) or an engine that cannot (vLLM on CPU, SGLang) is refused with the reason (exit 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from prefect_swarm.cli.output import OutputFormat, console, emit_json, table
from prefect_swarm.cli.swarms import OutputOpt
from prefect_swarm.exceptions import StateError
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import SleepReport
from prefect_swarm.state import StateStore

if TYPE_CHECKING:
    from prefect_swarm.swarm import Swarm

ReplicaOpt = Annotated[
    list[int] | None,
    typer.Option("--replica", "-r", help="Index of a replica (repeat for several); default: every replica."),
]


def sleep_cmd(
    name: Annotated[str, typer.Argument(help="The swarm.")],
    replica: ReplicaOpt = None,
    level: Annotated[
        int,
        typer.Option(
            "--level", min=1, max=2, help="1: weights kept in CPU memory (fast wake); 2: discarded (wake reloads them)."
        ),
    ] = 1,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Put replicas to sleep: out of the load balancer, GPU memory freed, allocation kept."""
    _report(_swarm(name).sleep(replica or (), level), output)


def wake_cmd(
    name: Annotated[str, typer.Argument(help="The swarm.")],
    replica: ReplicaOpt = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Wake sleeping replicas: back in the load balancer once each answers again."""
    _report(_swarm(name).wake(replica or ()), output)


def _swarm(name: str) -> Swarm:
    from prefect_swarm.swarm import LIVE_PHASES  # here: `prefect-swarm --help` does not load the backends

    store = StateStore()
    rec = store.require_swarm(name)  # unknown swarm: StateError, exit 3
    if rec.phase not in LIVE_PHASES:
        raise StateError(f"swarm '{name}' is {rec.phase}: it has no replica to sleep or wake.")
    return default_holding(store).attach(name)


def _report(reports: list[SleepReport], output: OutputFormat) -> None:
    rows = [r.to_dict() for r in reports]
    if output is OutputFormat.json:
        emit_json({"replicas": rows})
        return
    cols = ["replica", "url", "asleep", "level", "seconds"]
    console.print(table(None, cols, [[row[c] for c in cols] for row in rows]))
