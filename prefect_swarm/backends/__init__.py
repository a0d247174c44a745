"""Backends: where replicas serve (``serving/``) and where job processes run (``compute/``).

Nothing here imports prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_swarm.backends.registry import BUILTIN, BackendPair, build_backends

__all__ = ["BUILTIN", "BackendPair", "build_backends"]


def __getattr__(name: str) -> Any:
    """The registry's names, loaded on first use: a sidecar of one backend (the Slurm LB reconciler)
    does not import every backend."""
    if name in __all__:
        from prefect_swarm.backends import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'prefect_swarm.backends' has no attribute {name!r}")
