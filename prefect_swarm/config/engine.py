"""How one replica serves the model: vLLM (default), SGLang, or an arbitrary command."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prefect_swarm.config.base import Count, Seconds, StrictModel

EngineKind = Literal["vllm", "sglang", "command"]


class ParallelConfig(StrictModel):
    """How a replica's model is split over its GPUs: tensor x pipeline must equal ``gpus_per_replica``."""

    tensor: Count = Field(
        default=1, description="Tensor-parallel size (vLLM --tensor-parallel-size, SGLang --tp-size)."
    )
    pipeline: Count = Field(
        default=1, description="Pipeline-parallel size (vLLM --pipeline-parallel-size, SGLang --pp-size)."
    )


class EngineConfig(StrictModel):
    """The serving engine each replica runs."""

    kind: EngineKind = Field(
        default="vllm",
        description="Engine: 'vllm' (python -m vllm.entrypoints.openai.api_server), 'sglang' "
        "(python -m sglang.launch_server) or 'command' (the 'command' template below).",
    )
    python: str | None = Field(
        default=None,
        description="Python interpreter that has the engine installed (vllm/sglang kinds); "
        "default: the interpreter running prefect-swarm.",
    )
    command: list[str] | None = Field(
        default=None,
        description="For kind 'command': argv template; {host}, {port}, {model}, {served_model_name} "
        "and {python} are substituted per replica. Not passed through a shell.",
    )
    args: list[str] = Field(
        default_factory=list,
        description="Extra arguments appended to the engine command line, one list item per argument.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables set for the engine process only."
    )
    parallel: ParallelConfig | None = Field(
        default=None,
        description="Tensor and pipeline parallel sizes, {tensor: T, pipeline: P} with T x P = gpus_per_replica; "
        "default: tensor = gpus_per_replica, pipeline 1. A replica spanning several nodes (gpus_per_replica > "
        "gpus_per_node) usually sets tensor = gpus_per_node and pipeline = the number of nodes.",
    )
    health_path: str = Field(default="/health", description="HTTP path that returns 200 once the engine is up.")
    startup_timeout_s: Seconds = Field(
        default=900.0, description="Seconds a replica may take from start to a healthy /health."
    )

    @field_validator("python")
    @classmethod
    def _expand_home(cls, value: str | None) -> str | None:
        return os.path.expanduser(value) if value and value.startswith("~") else value

    @model_validator(mode="after")
    def _command_kind_needs_command(self) -> EngineConfig:
        if self.kind == "command" and not self.command:
            raise ValueError("engine.kind 'command' needs engine.command (an argv list)")
        if not self.health_path.startswith("/"):
            raise ValueError("engine.health_path must start with '/'")
        return self
