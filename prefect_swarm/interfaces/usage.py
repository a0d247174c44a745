"""GPU time a swarm has used, as its backend can best tell (:meth:`ServingBackend.gpu_usage`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GpuUsage:
    """GPU-hours used so far, where the figure comes from, and the resource shape it is priced by.

    ``gpu_hours`` is None when the backend cannot tell; ``reason`` then says why.
    """

    gpu_hours: float | None
    source: str
    """``sacct`` (Slurm accounting), ``wall`` (wall time x GPUs in use), ...; or ``n/a``."""
    shape: str | None = None
    """The resource shape a per-shape price applies to (Lepton); None elsewhere."""
    gpus: int = 0
    """GPUs the swarm holds now."""
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return asdict(self)


__all__ = ["GpuUsage"]
