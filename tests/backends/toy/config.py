"""The toy backend's config model and its entry in the table of backends."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prefect_swarm.backends.entry import BackendEntry
from prefect_swarm.backends.local.config import LocalConfig


class ToyConfig(LocalConfig):
    """Replicas as processes on this machine, each under a watchdog (the local backend's fields, and one more)."""

    type: Literal["toy"] = Field(default="toy", description="Backend discriminator: 'toy'.")  # type: ignore[assignment]
    greeting: str = Field(default="hello", description="A field only the toy backend has.")


ENTRY = BackendEntry(
    config=ToyConfig,
    serving="prefect_swarm.backends.toy.backend:ToyServing",
    compute="prefect_swarm.backends.toy.backend:ToyCompute",
    title="Toy",
    summary="Run a swarm's replicas as processes on this machine, as a toy.",
)
"""The toy backend in the table of backends."""
