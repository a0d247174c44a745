"""Prefect tasks around the control plane: retries, run logger, artifacts, events, stop events.

``swarm`` (up, ready, down), ``jobs`` (plan, run a shard, commit), ``reaper`` (orphans),
``artifacts``. Nothing below ``backends/``, ``jobs/`` or ``state/`` imports prefect; these tasks are
the wrapper. Import from the submodules: this package itself imports nothing, so the CLI can use
``tasks.reaper`` without paying for Prefect's import.
"""
