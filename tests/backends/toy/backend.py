"""The toy backend's serving and compute classes: the local backend's, under the toy's name."""

from __future__ import annotations

from prefect_swarm.backends.local.compute import LocalCompute
from prefect_swarm.backends.local.serving import LocalServing


class ToyServing(LocalServing):
    """ServingBackend of the toy backend."""

    backend = "toy"


class ToyCompute(LocalCompute):
    """ComputeBackend of the toy backend."""

    backend = "toy"
