"""Backends: where replicas serve (``serving/``) and where job processes run (``compute/``).

Nothing here imports prefect.
"""

from prefect_swarm.backends.registry import BUILTIN, Deployment, build_deployment

__all__ = ["BUILTIN", "Deployment", "build_deployment"]
