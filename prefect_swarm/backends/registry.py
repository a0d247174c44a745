"""The table of backends: every built-in backend's entry, listed in one place.

The config union, the error hints, the Prefect blocks and the package's lazy exports are built from
:data:`ENTRIES`; code outside ``backends/`` asks a backend's entry (:func:`entry_of`) instead of
switching on its name. A backend's serving and compute classes are imported only when a config
asks for them (:func:`build_backends`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.entry import BackendEntry, load
from prefect_swarm.backends.external.config import ENTRY as EXTERNAL
from prefect_swarm.backends.lepton.config import ENTRY as LEPTON
from prefect_swarm.backends.local.config import ENTRY as LOCAL
from prefect_swarm.backends.slurm.config import ENTRY as SLURM
from prefect_swarm.exceptions import ConfigError

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.interfaces import ComputeBackend, ServingBackend, ServingHandle
    from prefect_swarm.paths import SwarmPaths

ENTRIES: dict[str, BackendEntry] = {entry.type: entry for entry in (LOCAL, SLURM, LEPTON, EXTERNAL)}
"""Backend type -> its entry, in the order configs, blocks and messages list them."""

BUILTIN: dict[str, tuple[str, str]] = {kind: (e.serving, e.compute) for kind, e in ENTRIES.items()}
"""Backend type -> ("module:ServingClass", "module:ComputeClass") (read from :data:`ENTRIES`)."""


def entry_of(backend: Any) -> BackendEntry:
    """The entry of a backend config (``cfg.backend``) or of a backend type's name."""
    kind = backend if isinstance(backend, str) else backend.type
    if kind not in ENTRIES:
        raise ConfigError(f"backend type '{kind}' is not valid; choose one of {', '.join(ENTRIES)}.")
    return ENTRIES[kind]


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
    entry = entry_of(cfg.backend)
    serving = load(entry.serving)(cfg, paths)
    return BackendPair(cfg=cfg, paths=paths, serving=serving, compute_cls=load(entry.compute))
