"""Reattach to a swarm by name from the CLI, secrets included when a block holds them."""

from __future__ import annotations

from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm


def attach(name: str, store: StateStore | None = None) -> Swarm:
    """:meth:`Swarm.from_state`; for a swarm brought up from a saved SwarmSpec block whose secrets
    the environment lacks, reload them from that block (through the Prefect API)."""
    store = store or StateStore()
    rec = store.require_swarm(name)
    if rec.source:
        from prefect_swarm.tasks.swarm import reattach  # imports Prefect: only for block-based swarms

        return reattach(name, store)
    return Swarm.from_state(name, store=store)
