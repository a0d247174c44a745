"""Pydantic models that describe a swarm, and the layered loader that builds them.

The names below are loaded on first use (PEP 562): a process that needs one piece (the Slurm client
its time parser, a watchdog the cost model) does not pay for the loader's imports (YAML,
pydantic-settings) or for the models it does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_swarm import lazy_names

if TYPE_CHECKING:
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

_WHERE: dict[str, str] = {
    "BACKEND_TYPES": "prefect_swarm.config.backends",
    "BackendConfig": "prefect_swarm.config.backends",
    "ContainerConfig": "prefect_swarm.config.backends",
    "ExternalConfig": "prefect_swarm.config.backends",
    "LeptonConfig": "prefect_swarm.config.backends",
    "LeptonMount": "prefect_swarm.config.backends",
    "LocalConfig": "prefect_swarm.config.backends",
    "SlurmConfig": "prefect_swarm.config.backends",
    "EngineConfig": "prefect_swarm.config.engine",
    "SwarmConfig": "prefect_swarm.config.swarm",
    "deep_merge": "prefect_swarm.config.loader",
    "env_overrides": "prefect_swarm.config.loader",
    "load_config": "prefect_swarm.config.loader",
    "read_yaml": "prefect_swarm.config.loader",
}

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


__getattr__, __dir__ = lazy_names(__name__, _WHERE)
