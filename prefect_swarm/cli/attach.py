"""The CLI's :class:`~prefect_swarm.holding.Holding`: secrets from a block when the environment lacks
them, Prefect's word on flow runs when a Prefect API is configured."""

from __future__ import annotations

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.state import StateStore, SwarmRecord


def _block_secrets(rec: SwarmRecord) -> SwarmConfig | None:
    from prefect_swarm.tasks.swarm import block_secrets  # imports Prefect: only for block-based swarms

    return block_secrets(rec)


def _terminal_runs(run_ids: list[str]) -> dict[str, bool]:
    from prefect_swarm.tasks.flow_runs import terminal_runs  # imports Prefect: only when flow runs hold a swarm

    return terminal_runs(run_ids)


def holding(store: StateStore | None = None) -> Holding:
    """Holding for CLI commands (``holding().attach(name)`` reattaches to a swarm by name)."""
    return Holding(store or StateStore(), terminal_runs=_terminal_runs, secrets=_block_secrets)
