"""Backends: where replicas serve (``serving/``) and where job processes run (``compute/``).

Nothing here imports prefect.
"""

from prefect_swarm.backends.registry import BUILTIN, BackendPair, build_backends

__all__ = ["BUILTIN", "BackendPair", "build_backends"]
