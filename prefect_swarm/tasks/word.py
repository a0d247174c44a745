"""The Prefect layer's word for :mod:`prefect_swarm.holding` (its :class:`~prefect_swarm.holding.PrefectWord`),
registered when the ``tasks`` package is imported: whether flow runs have ended (the Prefect API), and
the secrets of the SwarmSpec block a swarm came from. Prefect is imported only inside each call, so
importing this module stays cheap.
"""

from __future__ import annotations

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import register_prefect_word
from prefect_swarm.state import SwarmRecord
from prefect_swarm.tasks.flow_runs import strict_terminal_runs, terminal_runs


class FlowRunsAndBlocks:
    """Prefect's word on flow runs (:mod:`prefect_swarm.tasks.flow_runs`) and the blocks' secrets
    (:func:`prefect_swarm.tasks.swarm.block_secrets`)."""

    def terminal_runs(self, run_ids: list[str], *, strict: bool = False) -> dict[str, bool]:
        """See :meth:`~prefect_swarm.holding.PrefectWord.terminal_runs`."""
        return strict_terminal_runs(run_ids) if strict else terminal_runs(run_ids)

    def secrets(self, rec: SwarmRecord) -> SwarmConfig | None:
        """See :meth:`~prefect_swarm.holding.PrefectWord.secrets`."""
        from prefect_swarm.tasks.swarm import block_secrets  # imports Prefect: only for block-based swarms

        return block_secrets(rec)


register_prefect_word(FlowRunsAndBlocks())
