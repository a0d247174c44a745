"""How one replica serves the model: vLLM (default), SGLang, or an arbitrary command."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prefect_swarm.config.base import Count, Seconds, StrictModel

EngineKind = Literal["vllm", "sglang", "command"]


SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token", "--openai-api-key"})
"""Engine flags whose value is a secret: refused in ``engine.args`` (the key goes in ``api_key``)."""
_AUTH_IN_ARG = re.compile(r"(?i)\b(authorization|x-api-key)\s*[:=]|\bbearer\s+\S")


class ParallelConfig(StrictModel):
    """How a replica's model is split over its GPUs: tensor x pipeline must equal ``gpus_per_replica``."""

    tensor: Count = Field(
        default=1, description="Tensor-parallel size (vLLM --tensor-parallel-size, SGLang --tp-size)."
    )
    pipeline: Count = Field(
        default=1, description="Pipeline-parallel size (vLLM --pipeline-parallel-size, SGLang --pp-size)."
    )


DEFAULT_BATCH_CAPACITY = 256
"""vLLM's ``max_num_seqs`` default for its OpenAI server on GPUs under 70 GB (1024 above, 128 per CPU
socket on CPU): what a replica is assumed to batch when nothing says."""


def _positive(value: str) -> int:
    try:
        return max(1, int(value))
    except ValueError:
        return DEFAULT_BATCH_CAPACITY


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
    capacity: Count | None = Field(
        default=None,
        description="Requests one replica runs at once (its batch size): a job keeps each replica this full "
        "plus a short queue, and never sends it more. Default: vllm's --max-num-seqs or sglang's "
        "--max-running-requests from args, else found by each job from the replica's /metrics (starting from 256, "
        "vLLM's default on most GPUs).",
    )
    health_path: str = Field(default="/health", description="HTTP path that returns 200 once the engine is up.")
    # --- sleep mode (replicas that sleep and wake) ---
    sleep_mode: bool = Field(
        default=False,
        description="Let replicas sleep and wake (`prefect-swarm sleep`/`wake`): a sleeping replica frees its GPU "
        "memory, leaves the load balancer and keeps its allocation. vLLM: adds --enable-sleep-mode and "
        "VLLM_SERVER_DEV_MODE=1 (CUDA and ROCm GPUs only: refused for gpus_per_replica 0); a 'command' engine gets "
        "VLLM_SERVER_DEV_MODE=1 and must serve vLLM's /sleep, /wake_up and /is_sleeping itself; SGLang: refused.",
    )
    startup_timeout_s: Seconds = Field(
        default=900.0, description="Seconds a replica may take from start to a healthy /health."
    )

    def batch_capacity(self) -> int:
        """What one replica can batch: :meth:`declared_capacity`, else 256."""
        return self.declared_capacity() or DEFAULT_BATCH_CAPACITY

    def declared_capacity(self) -> int | None:
        """What one replica batches as the config says it: ``capacity``, else the engine's own flag in
        ``args``; None when it does not say (a job then finds it from each replica's /metrics)."""
        if self.capacity is not None:
            return self.capacity
        flag = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}.get(self.kind)
        for i, arg in enumerate(self.args):
            if flag and arg.startswith(flag + "="):
                return _positive(arg.split("=", 1)[1])
            if flag and arg == flag and i + 1 < len(self.args):
                return _positive(self.args[i + 1])
        return None

    @field_validator("args")
    @classmethod
    def _no_secret_in_args(cls, args: list[str]) -> list[str]:
        """Arguments are written where secrets never go (the swarm's state, its rendered scripts, logs,
        ``validate``): a key flag or an authorization header among them is refused, never echoed."""
        for i, arg in enumerate(args):
            flag = arg.split("=", 1)[0].lower()
            if flag in SECRET_FLAGS or _AUTH_IN_ARG.search(arg):
                what = flag if flag in SECRET_FLAGS else "an authorization header"
                raise ValueError(
                    f"engine.args[{i}] carries a secret ({what}): "
                    "arguments are kept in the swarm's state, its scripts and logs. Give the swarm's key as "
                    "api_key (or PREFECT_SWARM_API_KEY: the engines get it from their environment), and a token the "
                    "engine reads (HF_TOKEN) from the environment: backend.export on Slurm, the submitting "
                    "shell's environment on the local backend, backend.secret_env on Lepton"
                )
        return args

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
