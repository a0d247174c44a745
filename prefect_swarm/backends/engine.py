"""How one replica's engine is started: its argv and environment, built from ``SwarmConfig.engine``.

Pure functions, shared by every backend that starts engine processes itself (local, Slurm):

    launch = engine_launch(cfg, host="127.0.0.1", port=8100)
    Popen(launch.argv, env={**os.environ, **launch.env, **launch.secret_env})

* ``vllm``:    ``python -m vllm.entrypoints.openai.api_server --model M --served-model-name S
  --host H --port P [--tensor-parallel-size N] *args``
* ``sglang``:  ``python -m sglang.launch_server --model-path M --served-model-name S --host H
  --port P [--tp-size N] *args``
* a replica of ``K > 1`` nodes (:func:`nodes_per_replica`): vLLM adds ``--tensor-parallel-size T
  --pipeline-parallel-size P --distributed-executor-backend ray`` (the backend forms the Ray cluster
  first); SGLang adds ``--tp-size T [--pp-size P] --nnodes K --node-rank R --dist-init-addr A``
  (no Ray; every node runs the same argv with its own rank);
* ``command``: ``engine.command`` with ``{host}``, ``{port}``, ``{model}``, ``{served_model_name}``
  and ``{python}`` substituted in each item (plain text replacement, no shell, other braces kept).

The API key never reaches argv (anyone can read a process's command line): it travels in
:attr:`EngineLaunch.secret_env`, which callers pass through the environment only and never write
to a spec file, a rendered script or a log.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces.jobenv import API_KEY

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SGLANG_MODULE = "sglang.launch_server"

VLLM_DEV_MODE = "VLLM_SERVER_DEV_MODE"
"""vLLM serves its development routes (sleep mode's ``/sleep``, ``/wake_up``, ``/is_sleeping``) only
with this set to 1 in its environment."""

_KEY_ENV_BY_KIND = {"vllm": "VLLM_API_KEY", "command": "VLLM_API_KEY"}


@dataclass(frozen=True)
class EngineLaunch:
    """What starts one replica: argv, plain environment additions, and secret environment additions."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)


def engine_python(cfg: SwarmConfig) -> str:
    """Interpreter that runs the engine: ``engine.python`` or the one running prefect-swarm."""
    return cfg.engine.python or sys.executable


_SERVERS: dict[str, tuple[str, str, str]] = {
    "vllm": (VLLM_MODULE, "--model", "--tensor-parallel-size"),
    "sglang": (SGLANG_MODULE, "--model-path", "--tp-size"),
}
"""Engine kind -> (server module, model flag, tensor-parallel flag)."""


_PP_FLAG = {"vllm": "--pipeline-parallel-size", "sglang": "--pp-size"}


def nodes_per_replica(cfg: SwarmConfig) -> int:
    """Nodes one replica spans: ``gpus_per_replica / gpus_per_node`` when a replica needs more GPUs than
    a node has (then it must be a whole multiple, else ConfigError naming both fields), else 1."""
    per_node, per_replica = cfg.gpus_per_node, cfg.gpus_per_replica
    if not per_node or per_replica <= per_node:
        return 1
    if per_replica % per_node:
        raise ConfigError(
            f"gpus_per_replica ({per_replica}) exceeds gpus_per_node ({per_node}) but is not a multiple of it: "
            "a replica spanning several nodes uses every GPU of each. Make gpus_per_replica a multiple of "
            "gpus_per_node, or fit it on one node."
        )
    return per_replica // per_node


def parallel_sizes(cfg: SwarmConfig) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes: ``engine.parallel``, checked against ``gpus_per_replica``;
    default ``(gpus_per_replica, 1)``."""
    par = cfg.engine.parallel
    if par is None:
        return max(1, cfg.gpus_per_replica), 1
    if par.tensor * par.pipeline != cfg.gpus_per_replica:
        raise ConfigError(
            f"engine.parallel.tensor ({par.tensor}) x engine.parallel.pipeline ({par.pipeline}) = "
            f"{par.tensor * par.pipeline} must equal gpus_per_replica ({cfg.gpus_per_replica})."
        )
    return par.tensor, par.pipeline


def uses_ray(cfg: SwarmConfig) -> bool:
    """A replica spanning several nodes forms a Ray cluster first (vLLM, command); SGLang does not."""
    return nodes_per_replica(cfg) > 1 and cfg.engine.kind != "sglang"


def engine_argv(
    cfg: SwarmConfig,
    *,
    host: str,
    port: int | str,
    node_rank: int | str = 0,
    dist_init_addr: str | None = None,
) -> list[str]:
    """The engine command line for a replica listening on ``host:port`` (holds no secrets; ``port`` may be
    a placeholder the replica's watchdog replaces with the port it picks). ``node_rank`` and
    ``dist_init_addr`` (``HEAD:PORT``) are used by a multi-node SGLang replica only."""
    eng = cfg.engine
    python = engine_python(cfg)
    nodes = nodes_per_replica(cfg)
    tensor, pipeline = parallel_sizes(cfg)
    if eng.kind in _SERVERS:
        module, model_flag, tp_flag = _SERVERS[eng.kind]
        argv = [python, "-m", module, model_flag, cfg.engine_model, "--served-model-name", cfg.model_name,
                "--host", host, "--port", str(port)]  # fmt: skip
        if tensor > 1 or pipeline > 1 or nodes > 1:
            argv += [tp_flag, str(tensor)]
        if pipeline > 1 or (nodes > 1 and eng.kind == "vllm"):
            argv += [_PP_FLAG[eng.kind], str(pipeline)]
        if nodes > 1 and eng.kind == "vllm":
            argv += ["--distributed-executor-backend", "ray"]
        if nodes > 1 and eng.kind == "sglang":
            if dist_init_addr is None:
                raise ConfigError("a multi-node SGLang replica needs the head's address (dist_init_addr).")
            argv += ["--nnodes", str(nodes), "--node-rank", str(node_rank), "--dist-init-addr", dist_init_addr]
    else:
        argv = substitute(
            eng.command or [],
            host=host,
            port=port,
            model=cfg.engine_model,
            served_model_name=cfg.model_name,
            python=python,
        )
    if eng.sleep_mode and eng.kind == "vllm":
        argv.append("--enable-sleep-mode")
    return [*argv, *eng.args]


def substitute(template: list[str], **values: object) -> list[str]:
    """Replace ``{key}`` in each item by ``values[key]``; unknown braces are left as they are."""
    out = []
    for item in template:
        for key, value in values.items():
            item = item.replace("{" + key + "}", str(value))
        out.append(item)
    return out


def engine_env(cfg: SwarmConfig) -> dict[str, str]:
    """Plain environment for the engine: the swarm's ``env`` overlaid by ``engine.env``; with
    ``engine.sleep_mode`` vLLM's dev mode (the only way its server exposes the sleep routes)."""
    dev = {VLLM_DEV_MODE: "1"} if cfg.engine.sleep_mode else {}
    return {**cfg.env, **dev, **cfg.engine.env}


def engine_secret_env(cfg: SwarmConfig) -> dict[str, str]:
    """The API key under the names the engine reads it from; empty without a key.

    Every engine gets it as :data:`jobenv.API_KEY`, the one name the swarm's clients use too, so a
    ``command`` engine can read it. vLLM reads ``VLLM_API_KEY``. SGLang only takes ``--api-key`` on
    its command line, which would expose the key in the process list, so an SGLang swarm with an API
    key is refused.
    """
    if cfg.api_key is None:
        return {}
    key = cfg.api_key.get_secret_value()
    if cfg.engine.kind == "sglang":
        raise ConfigError(
            "api_key is set but SGLang reads its key only from --api-key, which would expose it in the "
            "process list. Use engine.kind 'vllm', or a 'command' engine that reads "
            f"${API_KEY}."
        )
    return {API_KEY: key, _KEY_ENV_BY_KIND[cfg.engine.kind]: key}


def engine_launch(cfg: SwarmConfig, *, host: str, port: int) -> EngineLaunch:
    """Argv and environment of one replica listening on ``host:port``."""
    return EngineLaunch(
        argv=engine_argv(cfg, host=host, port=port), env=engine_env(cfg), secret_env=engine_secret_env(cfg)
    )


__all__ = [
    "EngineLaunch",
    "engine_argv",
    "engine_env",
    "engine_launch",
    "engine_python",
    "engine_secret_env",
    "nodes_per_replica",
    "parallel_sizes",
    "substitute",
    "uses_ray",
]
