"""The built-in backends, listed in one place; each is imported only when a config asks for it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefect_swarm.exceptions import ConfigError

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.interfaces import ComputeBackend, ServingBackend, ServingHandle
    from prefect_swarm.paths import SwarmPaths

# backend type -> ("module:ServingClass", "module:ComputeClass")
BUILTIN: dict[str, tuple[str, str]] = {
    "local": (
        "prefect_swarm.backends.local.serving:LocalServing",
        "prefect_swarm.backends.local.compute:LocalCompute",
    ),
    "slurm": (
        "prefect_swarm.backends.slurm.serving:SlurmServing",
        "prefect_swarm.backends.slurm.compute:SlurmCompute",
    ),
    "lepton": (
        "prefect_swarm.backends.lepton.serving:LeptonServing",
        "prefect_swarm.backends.lepton.compute:LeptonCompute",
    ),
    "external": (
        "prefect_swarm.backends.external.serving:ExternalServing",
        "prefect_swarm.backends.external.compute:ExternalCompute",
    ),
}


def _load(ref: str) -> Callable[..., object]:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class BackendPair:
    """A swarm's serving backend paired with the compute backend that runs jobs next to it.

    Serving backends are built as ``cls(cfg, paths)``; compute backends as
    ``cls(cfg, paths, serving_handle)`` because jobs may need the swarm (Slurm steps run inside
    the replicas' allocation).
    """

    cfg: SwarmConfig
    paths: SwarmPaths
    serving: ServingBackend
    compute_cls: Callable[..., ComputeBackend]

    def compute(self, handle: ServingHandle | None) -> ComputeBackend:
        """The compute backend for jobs against the swarm behind ``handle``."""
        return self.compute_cls(self.cfg, self.paths, handle)


def build_backends(cfg: SwarmConfig, paths: SwarmPaths) -> BackendPair:
    """Build the backends a config names; unknown types list the valid ones."""
    kind = cfg.backend.type
    if kind not in BUILTIN:
        raise ConfigError(f"backend type '{kind}' is not valid; choose one of {', '.join(sorted(BUILTIN))}.")
    serving_ref, compute_ref = BUILTIN[kind]
    serving = _load(serving_ref)(cfg, paths)
    return BackendPair(cfg=cfg, paths=paths, serving=serving, compute_cls=_load(compute_ref))  # type: ignore[arg-type]
