"""The snapshot of a parked swarm: what a fast restore needs, kept in the swarm's folder.

Parking gives back every GPU a swarm holds (BoatRamp's ``ComputeBackend`` snapshot): Slurm's replica
and LB jobs end, Lepton's endpoint goes to zero replicas, local engines stop. What a restore needs
stays on disk: the swarm's config (``config.yaml``, redacted) and key (``swarm.key``, 0600: the
snapshot names the file, never the key), the staged weights, the engine's caches, and what the
backend returns from :meth:`~prefect_swarm.interfaces.protocols.ServingBackend.park` (the addresses
its replicas take again). The snapshot file (:attr:`~prefect_swarm.paths.SwarmPaths.parked`) is
written 0600 and atomically into the swarm's private folder; its presence is what a job process
reads as "parked: wait, this is no outage".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect_swarm.paths import SwarmPaths, atomic_write_json, read_json


@dataclass(frozen=True)
class Snapshot:
    """What a restore of a parked swarm needs (JSON-safe, no secret)."""

    name: str
    backend: str
    fingerprint: str
    replicas: int
    reason: str
    """Why it was parked (``park`` by hand, idle past ``idle_timeout_s``)."""
    parked_at: float = field(default_factory=time.time)
    config_file: str = ""
    """The redacted config the swarm was brought up with."""
    key_file: str | None = None
    """Where the swarm's API key is kept (0600); the key itself is never in a snapshot."""
    staged_model: str | None = None
    """Where the staged weights are (a restore does not stage them again)."""
    caches: dict[str, str] = field(default_factory=dict)
    """The engine's caches a restore reuses (name -> folder)."""
    serving: dict[str, Any] = field(default_factory=dict)
    """What the backend's ``park`` returned: the addresses its replicas take again, its own ids."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        """From :meth:`to_dict`'s form (unknown keys of a newer version are dropped)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def write(self, paths: SwarmPaths) -> None:
        """Keep the snapshot in the swarm's folder (checked private; the file 0600, written atomically)."""
        paths.ensure()
        atomic_write_json(paths.parked, self.to_dict())

    @classmethod
    def read(cls, paths: SwarmPaths) -> Snapshot | None:
        """The swarm's snapshot, or None when it is not parked."""
        data = read_json(paths.parked)
        return cls.from_dict(data) if isinstance(data, dict) else None
