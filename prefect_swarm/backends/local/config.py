"""The local backend's config model and its entry in the table of backends."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prefect_swarm.backends.entry import BackendEntry
from prefect_swarm.config.base import NonNegativeInt, NonNegativeSeconds, Seconds
from prefect_swarm.config.cost import Priced


class LocalConfig(Priced):
    """Replicas are engine processes on this machine, each under a watchdog."""

    type: Literal["local"] = Field(default="local", description="Backend discriminator: 'local'.")
    host: str = Field(default="127.0.0.1", description="Interface the replicas listen on.")
    max_restarts: NonNegativeInt = Field(
        default=3, description="Restarts the watchdog allows a replica before marking it failed."
    )
    restart_backoff_s: NonNegativeSeconds = Field(
        default=2.0,
        description="First delay before a restart; doubles after each restart (capped 60 s).",
    )
    startup_grace_s: NonNegativeSeconds = Field(
        default=5.0,
        description="Seconds after a start before failed health checks count against a replica.",
    )
    health_interval_s: Seconds = Field(default=2.0, description="Seconds between the watchdog's health checks.")
    wall_time_s: Seconds | None = Field(
        default=24 * 3600.0,
        description="Wall-time limit of each replica in seconds: the watchdog stops it after this, "
        "so a swarm whose flow died cannot run forever. null disables the limit.",
    )
    gpus: list[str] | None = Field(
        default=None,
        description="GPU ids to hand out (CUDA_VISIBLE_DEVICES), gpus_per_replica to each replica; "
        "null: do not set CUDA_VISIBLE_DEVICES.",
    )


def _wall_time(backend: LocalConfig) -> str:
    return f"{backend.wall_time_s:g} s" if backend.wall_time_s else "none"


ENTRY = BackendEntry(
    config=LocalConfig,
    serving="prefect_swarm.backends.local.serving:LocalServing",
    compute="prefect_swarm.backends.local.compute:LocalCompute",
    title="Local",
    summary="Run a swarm's replicas as processes on the machine running the flow.",
    stages_models=True,
    disks_here=True,
    wall_time=_wall_time,
)
"""The local backend in the table of backends."""
