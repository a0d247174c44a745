"""Prefect tasks around the control plane: retries, run logger, artifacts, events, stop events.

``swarm`` (up, ready, down), ``jobs`` (plan, run a shard, commit), ``reaper`` (orphans),
``artifacts``. Nothing below ``backends/``, ``jobs/`` or ``state/`` imports prefect; these tasks are
the wrapper. Import from the submodules: this package itself imports no Prefect, so the CLI can
use ``tasks.reaper`` without paying for Prefect's import. Importing it registers the Prefect layer's
word with :mod:`prefect_swarm.holding` (:mod:`prefect_swarm.tasks.word`), so every
:func:`~prefect_swarm.holding.default_holding` of a process that uses Prefect has it.
"""

from prefect_swarm.tasks import word as word
