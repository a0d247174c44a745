"""Backend configs, one per backend, as a union discriminated by ``type``.

Each model only *describes* where replicas and jobs run. A backend's model lives in its own folder
(``prefect_swarm.backends.<name>.config``, beside its entry in the table of backends,
``prefect_swarm.backends.registry``); the union below is built from that table, and the models are
named here too, where they have always been imported from.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from prefect_swarm.backends.external.config import ExternalConfig
from prefect_swarm.backends.lepton.config import LeptonConfig, LeptonMount, lepton_priority_class
from prefect_swarm.backends.local.config import LocalConfig
from prefect_swarm.backends.registry import ENTRIES
from prefect_swarm.backends.slurm.config import (
    DEFAULT_EXPORT,
    SIGNAL_EARLY_S,
    ContainerConfig,
    SlurmConfig,
    SlurmJobsConfig,
    SlurmLBConfig,
    SlurmTime,
)

__all__ = [
    "BACKEND_TYPES",
    "CLIENT_SIDE_FIELDS",
    "DEFAULT_EXPORT",
    "SIGNAL_EARLY_S",
    "BackendConfig",
    "ContainerConfig",
    "ExternalConfig",
    "LeptonConfig",
    "LeptonMount",
    "LocalConfig",
    "SlurmConfig",
    "SlurmJobsConfig",
    "SlurmLBConfig",
    "SlurmTime",
    "lepton_priority_class",
]

CLIENT_SIDE_FIELDS: frozenset[str] = frozenset(
    {
        "cost",
        "max_concurrency",
        "requests_per_minute",
        "tokens_per_minute",
        "request_timeout_s",
        "api_key_env",
        "api_key_secret",
    }
)
"""Backend fields that say how clients use a swarm (its price, budget, limits, where its key is read), not
which engine answers: left out of the engine fingerprint, so changing them resumes the same checkpoints."""

if TYPE_CHECKING:  # the type checker's view of the built-in members
    BackendConfig = Annotated[LocalConfig | SlurmConfig | LeptonConfig | ExternalConfig, Field(discriminator="type")]
else:
    BackendConfig = Annotated[typing.Union[tuple(e.config for e in ENTRIES.values())], Field(discriminator="type")]  # noqa: UP007
"""Any backend config; the ``type`` key picks the model (one member per entry of the table of backends)."""

BACKEND_TYPES: tuple[str, ...] = tuple(ENTRIES)
"""The backend types, in the table's order."""
