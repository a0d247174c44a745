"""``prefect-swarm exec NAME [--replica i] -- CMD ...``: a one-shot command inside a running replica.

The command runs in the replica's allocation and environment (:meth:`ServingBackend.exec_command`):
on local, a process with the replica's environment (its GPUs, the API key, ``PORT``) in the swarm's
folder; on Slurm, ``srun --jobid=<the replica's task> --overlap`` on its node. No shell is put in
between: pass ``sh -c '...'`` for one. stdin/stdout/stderr are the terminal's, and the command's
exit code is this command's exit code. A backend without the ``exec`` capability (Lepton) refuses
with its reason (exit 2) before anything runs; an unknown swarm exits 3, a stopped one 4.
"""

from __future__ import annotations

from typing import Annotated

import typer

from prefect_swarm.exceptions import ConfigError, ReadinessError
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import Capability, ServingHandle
from prefect_swarm.interfaces.types import ServingPhase
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import StateStore


def exec_cmd(
    name: Annotated[str, typer.Argument(help="The swarm.")],
    command: Annotated[list[str], typer.Argument(help="The command and its arguments, after `--`.")],
    replica: Annotated[int, typer.Option("--replica", "-r", help="Index of the replica to run in.")] = 0,
) -> None:
    """Run a one-shot command inside a running replica; its exit code is passed through.

    Examples: `prefect-swarm exec NAME -- nvidia-smi`,
    `prefect-swarm exec NAME --replica 1 -- sh -c 'curl -s localhost:$PORT/metrics'`.
    """
    store = StateStore()
    rec = store.require_swarm(name)  # unknown swarm: StateError, exit 3
    swarm = default_holding(store).attach(name)
    serving = swarm.backends.serving
    serving.capabilities().require(Capability.EXEC, "prefect-swarm exec")
    replicas = swarm.cfg.replicas
    if not 0 <= replica < replicas:
        raise ConfigError(f"--replica {replica} is out of range: swarm '{name}' has replicas 0..{replicas - 1}.")
    handle: ServingHandle | None = swarm.handle
    if rec.phase is ServingPhase.STOPPED or handle is None:
        why = "it was taken down" if rec.phase is ServingPhase.STOPPED else "nothing was submitted for it yet"
        raise _stopped(name, why)
    status = serving.status(handle)
    if status.phase is ServingPhase.STOPPED:
        raise _stopped(name, status.detail)
    code = serving.exec_command(handle, replica, command)
    raise typer.Exit(128 - code if code < 0 else code)  # killed by signal N: 128+N, as a shell reports it


def _stopped(name: str, why: str) -> ReadinessError:
    return ReadinessError(
        f"swarm '{name}' is stopped ({why}): it has no replica to run a command in.",
        hint=f"bring it up again with `prefect-swarm up -c {SwarmPaths.for_swarm(name).config}`; "
        f"`prefect-swarm status {name}` shows what is left.",
    )
