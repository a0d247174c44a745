"""``prefect-swarm logs NAME [--replica i] [--follow]``: a replica's engine log on stdout.

The log comes through the serving backend (:meth:`ServingBackend.replica_log`): on local and Slurm
the replica's log file in the swarm's folder, on Lepton the replica's log as the workspace API
streams it. ``--follow`` keeps printing what the log gains while the replica runs; Ctrl-C stops it.
An unknown swarm exits 3; a backend that keeps no replica log refuses with its reason (exit 2).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from prefect_swarm.exceptions import ConfigError, ReadinessError
from prefect_swarm.holding import default_holding
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import StateStore


def logs_cmd(
    name: Annotated[str, typer.Argument(help="The swarm.")],
    replica: Annotated[int, typer.Option("--replica", "-r", help="Index of the replica whose log to show.")] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what the log gains while the replica runs.")
    ] = False,
) -> None:
    """Print a replica's engine log; with --follow, keep following it (Ctrl-C stops).

    Examples: `prefect-swarm logs NAME`, `prefect-swarm logs NAME --replica 1 --follow`.
    """
    store = StateStore()
    store.require_swarm(name)  # unknown swarm: StateError, exit 3
    swarm = default_holding(store).attach(name)
    replicas = swarm.cfg.replicas
    if not 0 <= replica < replicas:
        raise ConfigError(f"--replica {replica} is out of range: swarm '{name}' has replicas 0..{replicas - 1}.")
    handle = swarm.handle
    if handle is None:
        raise ReadinessError(
            f"swarm '{name}' has no replica log: nothing was submitted for it yet.",
            hint=f"bring it up with `prefect-swarm up -c {SwarmPaths.for_swarm(name).config}`.",
        )
    chunks = swarm.backends.serving.replica_log(handle, replica, follow=follow)
    try:
        for chunk in chunks:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
