"""Backends: where replicas serve (``serving/``) and where job processes run (``compute/``).

Nothing here imports prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_swarm import lazy_names

if TYPE_CHECKING:
    from prefect_swarm.backends.registry import BUILTIN, BackendPair, build_backends

__all__ = ["BUILTIN", "BackendPair", "build_backends"]


__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, "prefect_swarm.backends.registry"))
