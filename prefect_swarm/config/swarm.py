"""SwarmConfig: one model served by N replicas of an engine, on one backend."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from prefect_swarm.backends.registry import ENTRIES, entry_of
from prefect_swarm.config.backends import BACKEND_TYPES, BackendConfig, LocalConfig
from prefect_swarm.config.base import Count, NonNegativeInt, Port, Seconds, StrictModel
from prefect_swarm.config.engine import EngineConfig

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,35}$")

Sharing = Literal["shared", "exclusive"]
"""How flow runs use one swarm: ``shared`` (concurrent runs share it, each holding a lease) or
``exclusive`` (one run at a time: the Prefect global concurrency limit ``swarm:<name>`` of 1)."""


STAGING_BACKENDS = tuple(kind for kind, entry in ENTRIES.items() if entry.stages_models)
"""Backends that run ``prefect_swarm.sidecar.stage`` before their engines (their entries say so)."""


def _backend_type(backend: object) -> object:
    """The ``type`` of a backend given as a dict or as a config model (None for anything else)."""
    if isinstance(backend, dict):
        return backend.get("type")
    return backend.model_dump(include={"type"}).get("type") if isinstance(backend, BaseModel) else None


class StageConfig(StrictModel):
    """Copy the model directory to node-local disk once per node before the engine starts
    (``prefect_swarm.sidecar.stage``); the engine then loads the staged copy."""

    to: str = Field(
        min_length=1,
        description="Folder on each node's local disk that holds staged copies (absolute path, e.g. /local/models).",
    )
    from_: str | None = Field(
        default=None,
        alias="from",
        description="Model directory to copy (absolute path every node can read); default: the model value.",
    )

    @field_validator("to", "from_")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = os.path.expanduser(value) if value.startswith("~") else value
        if not os.path.isabs(value):
            raise ValueError(f"'{value}' is not an absolute path; stage.to and stage.from need one.")
        return value


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
        description=f"Where the replicas run: {', '.join(BACKEND_TYPES[:-1])} or {BACKEND_TYPES[-1]} (key 'type').",
    )
    stage: StageConfig | None = Field(
        default=None,
        description="Stage the model on node-local disk before the engine starts: {to: DIR, from: MODEL_DIR}. "
        "Each node copies it once (keyed by a size+mtime hash of the files) and the engine loads the copy.",
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

    @model_validator(mode="before")
    @classmethod
    def _no_gpus_of_ours(cls, data: object) -> object:
        """A swarm whose backend holds no GPUs of ours (external): gpus_per_replica defaults to 0 (no GPU-hours)."""
        if isinstance(data, dict) and "gpus_per_replica" not in data:
            backend = data.get("backend")
            kind = _backend_type(backend)
            if kind in ENTRIES and not ENTRIES[kind].holds_gpus:
                return {**data, "gpus_per_replica": 0}
        return data

    @model_validator(mode="after")
    def _fits_on_node(self) -> SwarmConfig:
        per_node, per_replica, gpus = self.replicas_per_node, self.gpus_per_replica, self.gpus_per_node
        if gpus and per_node and per_replica and per_node * per_replica > gpus:
            raise ValueError(
                f"replicas_per_node ({per_node}) x gpus_per_replica ({per_replica}) exceeds gpus_per_node ({gpus})"
            )
        return self

    @model_validator(mode="after")
    def _stage_source(self) -> SwarmConfig:
        if self.stage is not None and self.backend.type not in STAGING_BACKENDS:
            raise ValueError(
                f"stage: backend '{self.backend.type}' has no node-local disk prefect-swarm prepares "
                f"(staging runs on {', '.join(STAGING_BACKENDS)}); remove stage"
            )
        if self.stage is not None and self.stage.from_ is None and not os.path.isabs(self.model):
            raise ValueError(
                f"stage: model '{self.model}' is not an absolute directory path, so there is nothing to copy; "
                "set stage.from to the model directory"
            )
        return self

    @property
    def staged_model(self) -> str | None:
        """Where ``stage`` puts the model on each node: ``<to>/<name of the source>-<8 hex of its path>``
        (one folder per source path, so two models with the same folder name never share a copy); None
        without ``stage``."""
        if self.stage is None:
            return None
        return staged_path(self.stage.to, self.stage.from_ or self.model)

    @property
    def stage_source(self) -> str | None:
        """The directory ``stage`` copies (``stage.from``, else the model); None without ``stage``."""
        if self.stage is None:
            return None
        return self.stage.from_ or self.model

    @property
    def engine_model(self) -> str:
        """The model path the engine is given: the staged copy when ``stage`` is set, else the model."""
        return self.staged_model or self.model

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

    @property
    def run_dir(self) -> str | None:
        """The backend's run dir (Slurm ``backend.run_dir``), where the swarm's folder and its jobs
        live (:meth:`prefect_swarm.paths.SwarmPaths.of`); None: under ``$PREFECT_SWARM_HOME``."""
        return entry_of(self.backend).run_dir(self.backend)

    def redacted(self) -> dict:
        """A JSON-safe dict with every secret set to None (for state rows, logs and rendered files).

        Secrets are dropped rather than masked so that reloading a redacted config can never
        mistake a mask for the secret itself.
        """
        return _strip_secrets(self)


def secretless(data: object) -> object:
    """``data`` (a raw config mapping, or lists and mappings holding some: a flow's parameters) with the
    value of every secret field (:data:`~prefect_swarm.config.errors.SECRET_FIELDS`: ``api_key``, a
    backend ``token``) set to None, as :meth:`SwarmConfig.redacted` drops them."""
    from prefect_swarm.config.errors import SECRET_FIELDS

    if isinstance(data, dict):
        return {k: None if k in SECRET_FIELDS and isinstance(v, str) else secretless(v) for k, v in data.items()}
    if isinstance(data, list):
        return [secretless(v) for v in data]
    return data


def staged_path(to: str, source: str) -> str:
    """The staged folder of ``source`` under ``to`` (see :attr:`SwarmConfig.staged_model`)."""
    source = source.rstrip("/") or "/"
    digest = hashlib.sha256(source.encode()).hexdigest()[:8]
    return str(PurePosixPath(to) / f"{PurePosixPath(source).name or 'model'}-{digest}")


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
