"""How one replica's engine is started: its argv and environment, built from ``SwarmConfig.engine``.

Pure functions, shared by every backend that starts engine processes itself (local, Slurm):

    launch = engine_launch(cfg, host="127.0.0.1", port=8100)
    Popen(launch.argv, env={**os.environ, **launch.env, **launch.secret_env})

* ``vllm``:    ``python -m vllm.entrypoints.openai.api_server --model M --served-model-name S
  --host H --port P [--tensor-parallel-size N] *args``
* ``sglang``:  ``python -m sglang.launch_server --model-path M --served-model-name S --host H
  --port P [--tp-size N] *args``
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


def engine_argv(cfg: SwarmConfig, *, host: str, port: int | str) -> list[str]:
    """The engine command line for a replica listening on ``host:port`` (holds no secrets; ``port`` may be
    a placeholder the replica's watchdog replaces with the port it picks)."""
    eng = cfg.engine
    python = engine_python(cfg)
    if eng.kind in _SERVERS:
        module, model_flag, tp_flag = _SERVERS[eng.kind]
        argv = [python, "-m", module, model_flag, cfg.model, "--served-model-name", cfg.model_name,
                "--host", host, "--port", str(port)]  # fmt: skip
        if cfg.gpus_per_replica > 1:
            argv += [tp_flag, str(cfg.gpus_per_replica)]
    else:
        argv = substitute(
            eng.command or [],
            host=host,
            port=port,
            model=cfg.model,
            served_model_name=cfg.model_name,
            python=python,
        )
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
    """Plain environment for the engine: the swarm's ``env`` overlaid by ``engine.env``."""
    return {**cfg.env, **cfg.engine.env}


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
    "substitute",
]
