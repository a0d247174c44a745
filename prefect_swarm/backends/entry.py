"""What the rest of the package knows of one backend: its :class:`BackendEntry`.

Each ``backends/<name>/config.py`` holds the backend's config model and its ``ENTRY``;
``backends/registry.py`` lists the entries, and everything that used to switch on a backend's name
(the config union, the error hints, the Prefect blocks, the CLI's checks) reads them instead. An
entry imports nothing heavy: its serving and compute classes are named as ``"module:Class"`` and
imported when a swarm is built, so the config layer can read the table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from prefect_swarm.config import SwarmConfig


def load(ref: str) -> Any:
    """The object ``"module:name"`` names, imported now."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _no_wall_time(backend: Any) -> str:
    return "backend default"


def _nothing(_: Any) -> Any:
    return None


def _none_listed(_: Any) -> list[Any]:
    return []


@dataclass(frozen=True)
class BackendEntry:
    """One backend: its config model, its implementations and the facts others act on.

    The hooks take the backend's config (``cfg.backend``) or the whole swarm config, as named, and
    default to "nothing to say", so an entry states only where its backend differs.
    """

    config: type[BaseModel]
    """The config model; its ``type`` literal is the backend's name (the union's tag)."""
    serving: str
    """``"module:Class"`` of the :class:`~prefect_swarm.interfaces.ServingBackend`, built ``cls(cfg, paths)``."""
    compute: str
    """``"module:Class"`` of the :class:`~prefect_swarm.interfaces.ComputeBackend`, built
    ``cls(cfg, paths, serving_handle)``."""
    title: str
    """How the backend is named to a person ("Slurm"); its Prefect block is ``<title>Backend``."""
    summary: str
    """One line on what a swarm on this backend is (the block's description)."""
    secret_fields: tuple[str, ...] = ()
    """Backend fields holding a secret (``SecretStr``); each ``F`` may name its variable in ``F_env``.
    Kept out of printed plans, restored from the environment or the swarm's own record."""
    secret_scope: tuple[str, ...] = ()
    """Backend fields that must match for a recorded secret to be used again (the Lepton workspace)."""
    stages_models: bool = False
    """Runs ``prefect_swarm.sidecar.stage`` on its nodes before the engines (``stage`` is allowed)."""
    holds_gpus: bool = True
    """Its replicas hold GPUs of ours (false: ``gpus_per_replica`` defaults to 0, no GPU-hours)."""
    nginx_lb: bool = False
    """Its swarm's endpoint is our nginx load balancer (``top`` reads its ``stub_status``)."""
    disks_here: bool = False
    """Its nodes' disks are this machine's (``volumes`` lists and removes the staged model copies here)."""
    client_limits: bool = False
    """Its config bounds the jobs' clients (``max_concurrency``, ``requests_per_minute``,
    ``tokens_per_minute``), applied when a job is sized for the swarm."""
    shard_placement: str | None = None
    """``"module:function"`` saying where a batch job's shards run (``validate``), when the backend
    places them itself."""
    run_dir: Callable[[Any], str | None] = _nothing
    """Where the swarm's folder lives for this backend config (None: under ``$PREFECT_SWARM_HOME``)."""
    wall_time: Callable[[Any], str] = _no_wall_time
    """The replicas' wall-time limit as a person reads it."""
    key_block: Callable[[Any], str | None] = _nothing
    """The Prefect Secret block holding the swarm's API key, when the config names one."""
    needs: Callable[[Any], list[tuple[str, str]]] = _none_listed
    """Capabilities this backend config asks for (a :class:`~prefect_swarm.interfaces.Capability`'s value),
    each with what asked; refused before anything starts when the backend lacks one."""
    warnings: Callable[[SwarmConfig], list[str]] = _none_listed
    """What is valid but risky in a swarm config on this backend (``validate`` prints it)."""

    @property
    def type(self) -> str:
        """The backend's name: the ``type`` key of its config."""
        return str(self.config.model_fields["type"].default)

    @property
    def block(self) -> str:
        """The name of its Prefect block class in ``prefect_swarm.blocks``."""
        return f"{self.title}Backend"

    def placement(self, cfg: SwarmConfig) -> str | None:
        """Where a batch job's shards run on this swarm, when the backend places them itself."""
        return load(self.shard_placement)(cfg) if self.shard_placement else None
