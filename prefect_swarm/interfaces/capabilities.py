"""What each backend can do, each missing capability with its reason.

Config validation consults these before anything starts: an unsupported request is refused
with the backend's reason instead of failing halfway through a run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prefect_swarm.backends.registry import entry_of
from prefect_swarm.exceptions import ConfigError

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig


class Capability(str, enum.Enum):
    """A feature a backend may or may not offer."""

    LOAD_BALANCER = "load_balancer"
    WATCHDOG = "watchdog"
    PREEMPTION_SIGNAL = "preemption_signal"
    GPU_REQUEST = "gpu_request"
    MULTI_NODE = "multi_node"
    DETACHED_JOBS = "detached_jobs"
    SHARED_STORAGE = "shared_storage"
    CONTAINERS = "containers"
    WALL_TIME = "wall_time"
    EXEC = "exec"  # a one-shot command inside a running replica's allocation (`prefect-swarm exec`)
    # --- sleep and wake (issue 42: replicas that free their GPUs and keep their allocation) ---
    SLEEP_WAKE = "sleep_wake"  # put a replica's engine to sleep and wake it through its own port

    # park and restore (scale to zero and back, `prefect-swarm park` / `restore`)
    PARK = "park"


@dataclass(frozen=True)
class Capabilities:
    """A backend's supported capabilities; ``missing`` maps each unsupported one to a reason."""

    backend: str
    supported: frozenset[Capability]
    missing: dict[Capability, str] = field(default_factory=dict)
    max_replicas: int | None = None

    @classmethod
    def all_but(cls, backend: str, missing: dict[Capability, str], max_replicas: int | None = None) -> Capabilities:
        """Every capability except ``missing`` (each with the reason the backend lacks it)."""
        return cls(backend, frozenset(Capability) - missing.keys(), dict(missing), max_replicas)

    def supports(self, cap: Capability) -> bool:
        """True when the backend offers ``cap``."""
        return cap in self.supported

    def require(self, cap: Capability, what: str) -> None:
        """Raise ConfigError naming ``what`` asked for ``cap`` and why the backend cannot."""
        if not self.supports(cap):
            reason = self.missing.get(cap, "not supported")
            raise ConfigError(f"{what} needs {cap.value}, which the {self.backend} backend lacks: {reason}.")

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form for `validate` output."""
        return {
            "backend": self.backend,
            "supported": sorted(c.value for c in self.supported),
            "missing": {c.value: r for c, r in sorted(self.missing.items())},
            "max_replicas": self.max_replicas,
        }


def check_config(cfg: SwarmConfig, caps: Capabilities) -> None:
    """Refuse a config that asks for something the backend cannot do. Starts nothing."""
    if caps.max_replicas is not None and cfg.replicas > caps.max_replicas:
        raise ConfigError(
            f"replicas: {cfg.replicas} asked, the {caps.backend} backend runs at most {caps.max_replicas}. "
            "Lower replicas or pick another backend."
        )
    packed = cfg.gpus_per_node is not None or cfg.replicas_per_node is not None
    if packed and cfg.replicas > cfg.effective_replicas_per_node:
        caps.require(
            Capability.MULTI_NODE, f"replicas={cfg.replicas} with replicas_per_node={cfg.effective_replicas_per_node}"
        )
    if cfg.gpus_per_node and cfg.gpus_per_replica > cfg.gpus_per_node:
        caps.require(
            Capability.MULTI_NODE,
            f"gpus_per_replica={cfg.gpus_per_replica} over gpus_per_node={cfg.gpus_per_node} (replica spans nodes)",
        )
    for cap, what in entry_of(cfg.backend).needs(cfg.backend):
        caps.require(Capability(cap), what)
    if cfg.engine.sleep_mode:
        check_sleep_mode(cfg, caps)


# --- sleep and wake ---
def check_sleep_mode(cfg: SwarmConfig, caps: Capabilities) -> None:
    """``engine.sleep_mode`` needs a backend that reaches each replica's port and an engine that sleeps
    (vLLM on CUDA or ROCm GPUs; a ``command`` engine is taken at its word)."""
    caps.require(Capability.SLEEP_WAKE, "engine.sleep_mode")
    if cfg.engine.kind == "sglang":
        raise ConfigError(
            "engine.sleep_mode: SGLang has no vLLM-style sleep mode (/sleep, /wake_up, /is_sleeping). "
            "Use engine.kind 'vllm', or remove engine.sleep_mode."
        )
    if cfg.engine.kind == "vllm" and cfg.gpus_per_replica == 0:
        raise ConfigError(
            "engine.sleep_mode: vLLM's sleep mode runs on CUDA and ROCm GPUs only, and gpus_per_replica 0 runs "
            "vLLM on CPU (vLLM refuses --enable-sleep-mode there). Give each replica a GPU (gpus_per_replica >= 1 "
            "on a backend with GPUs), or remove engine.sleep_mode."
        )
