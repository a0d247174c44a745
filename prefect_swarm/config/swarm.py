"""SwarmConfig: one model served by N replicas of an engine, on one backend."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from prefect_swarm.config.backends import BackendConfig, LocalConfig
from prefect_swarm.config.base import Count, NonNegativeInt, Port, Seconds, StrictModel
from prefect_swarm.config.engine import EngineConfig

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,35}$")

Sharing = Literal["shared", "exclusive"]
"""How flow runs use one swarm: ``shared`` (concurrent runs share it, each holding a lease) or
``exclusive`` (one run at a time: the Prefect global concurrency limit ``swarm:<name>`` of 1)."""


class SwarmConfig(StrictModel):
    """A swarm: which model, how many replicas of which engine, on which backend."""

    name: str = Field(
        description="Swarm name: lowercase letters, digits and '-', starting with a letter, at most 36 chars.",
    )
    model: str = Field(min_length=1, description="Model path or id the engine loads.")
    served_model_name: str | None = Field(
        default=None, description="Model name clients send in requests; default: the model value."
    )
    replicas: Count = Field(default=1, description="Number of engine replicas.")
    gpus_per_replica: NonNegativeInt = Field(
        default=1, description="GPUs per replica (tensor parallel size for vLLM); 0 for CPU engines."
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        description="GPUs each node has; with replicas_per_node it packs replicas onto nodes.",
    )
    replicas_per_node: int | None = Field(
        default=None,
        ge=1,
        description="Replicas per node; default: gpus_per_node // gpus_per_replica, else 1.",
    )
    port: Port = Field(default=8100, description="Base port: replica i listens on port + i.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="The engine each replica runs.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables for replicas and job processes."
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="API key the engine requires (vLLM --api-key); passed via the environment, never logged.",
    )
    ready_timeout_s: Seconds = Field(
        default=1800.0,
        description="Seconds from 'up' until every replica must answer a chat completion.",
    )
    backend: BackendConfig = Field(
        default_factory=LocalConfig,
        description="Where the replicas run: local, slurm or lepton (key 'type').",
    )
    sharing: Sharing = Field(
        default="shared",
        description="How flow runs use this swarm: 'shared' (concurrent runs share it; the last one to end "
        "stops it) or 'exclusive' (one run at a time, through the Prefect global concurrency limit "
        "swarm:NAME of 1). A flow's 'sharing' parameter, when given, overrides it.",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"'{value}' is not a valid swarm name: use lowercase letters, digits and '-', "
                "start with a letter, at most 36 characters"
            )
        return value

    @field_validator("model")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        return os.path.expanduser(value) if value.startswith("~") else value

    @model_validator(mode="after")
    def _fits_on_node(self) -> SwarmConfig:
        per_node, per_replica, gpus = self.replicas_per_node, self.gpus_per_replica, self.gpus_per_node
        if gpus and per_node and per_replica and per_node * per_replica > gpus:
            raise ValueError(
                f"replicas_per_node ({per_node}) x gpus_per_replica ({per_replica}) exceeds gpus_per_node ({gpus})"
            )
        return self

    @property
    def model_name(self) -> str:
        """The name clients put in the request's ``model`` field."""
        return self.served_model_name or self.model

    @property
    def effective_replicas_per_node(self) -> int:
        """Replicas packed on one node."""
        if self.replicas_per_node:
            return self.replicas_per_node
        if self.gpus_per_node and self.gpus_per_replica:
            return max(1, self.gpus_per_node // self.gpus_per_replica)
        return 1

    def redacted(self) -> dict:
        """A JSON-safe dict with every secret set to None (for state rows, logs and rendered files).

        Secrets are dropped rather than masked so that reloading a redacted config can never
        mistake a mask for the secret itself.
        """
        return _strip_secrets(self)


def _strip_secrets(model: BaseModel) -> dict:
    out: dict = {}
    for name, info in type(model).model_fields.items():
        key = info.alias or name
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            out[key] = None
        elif isinstance(value, BaseModel):
            out[key] = _strip_secrets(value)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            out[key] = [_strip_secrets(v) for v in value]
        else:
            out[key] = _jsonable(value)
    return out


def _jsonable(value: object) -> object:
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)
