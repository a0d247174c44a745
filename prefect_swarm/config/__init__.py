"""Pydantic models that describe a swarm, and the layered loader that builds them."""

from prefect_swarm.config.backends import (
    BACKEND_TYPES,
    BackendConfig,
    ContainerConfig,
    ExternalConfig,
    LeptonConfig,
    LeptonMount,
    LocalConfig,
    SlurmConfig,
)
from prefect_swarm.config.engine import EngineConfig
from prefect_swarm.config.loader import deep_merge, env_overrides, load_config, read_yaml
from prefect_swarm.config.swarm import SwarmConfig

__all__ = [
    "BACKEND_TYPES",
    "BackendConfig",
    "ContainerConfig",
    "EngineConfig",
    "ExternalConfig",
    "LeptonConfig",
    "LeptonMount",
    "LocalConfig",
    "SlurmConfig",
    "SwarmConfig",
    "deep_merge",
    "env_overrides",
    "load_config",
    "read_yaml",
]
