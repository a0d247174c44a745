"""Engine argv/env building (pure): vLLM, SGLang, command templates; secrets only in secret_env."""

from __future__ import annotations

import sys

import pytest

from prefect_swarm.backends.engine import (
    engine_argv,
    engine_launch,
    engine_python,
    substitute,
)
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces.jobenv import API_KEY


def _cfg(**over: object) -> SwarmConfig:
    return SwarmConfig.model_validate({"name": "e", "model": "org/model", **over})


def test_vllm_argv() -> None:
    cfg = _cfg(served_model_name="m", engine={"python": "/py", "args": ["--dtype", "float32"]})
    assert engine_argv(cfg, host="0.0.0.0", port=9000) == [
        "/py",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "org/model",
        "--served-model-name",
        "m",
        "--host",
        "0.0.0.0",
        "--port",
        "9000",
        "--dtype",
        "float32",
    ]


@pytest.mark.parametrize(("gpus", "tp"), [(0, None), (1, None), (4, "4")])
def test_vllm_tensor_parallel_only_above_one_gpu(gpus: int, tp: str | None) -> None:
    argv = engine_argv(_cfg(gpus_per_replica=gpus), host="h", port=1)
    if tp is None:
        assert "--tensor-parallel-size" not in argv
    else:
        assert argv[argv.index("--tensor-parallel-size") + 1] == tp


def test_sglang_argv() -> None:
    argv = engine_argv(_cfg(engine={"kind": "sglang"}, gpus_per_replica=2), host="h", port=7)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "org/model"
    assert argv[argv.index("--served-model-name") + 1] == "org/model"
    assert argv[argv.index("--port") + 1] == "7" and argv[argv.index("--tp-size") + 1] == "2"


def test_command_template_substitution() -> None:
    cmd = [
        "{python}",
        "serve.py",
        "--at",
        "{host}:{port}",
        "--m",
        "{model}",
        "--n",
        "{served_model_name}",
        '{"json": "kept"}',
    ]
    engine = {"kind": "command", "command": cmd, "python": "/p", "args": ["-v"]}
    cfg = _cfg(served_model_name="s", engine=engine)
    assert engine_argv(cfg, host="1.2.3.4", port=80) == [
        "/p",
        "serve.py",
        "--at",
        "1.2.3.4:80",
        "--m",
        "org/model",
        "--n",
        "s",
        '{"json": "kept"}',
        "-v",
    ]


def test_substitute_leaves_unknown_braces() -> None:
    assert substitute(["{a}-{b}"], a=1) == ["1-{b}"]


def test_env_and_secret_env() -> None:
    cfg = _cfg(env={"A": "1", "B": "swarm"}, engine={"env": {"B": "engine"}}, api_key="sk-123")
    launch = engine_launch(cfg, host="h", port=1)
    assert launch.env == {"A": "1", "B": "engine"}
    assert launch.secret_env == {"VLLM_API_KEY": "sk-123", API_KEY: "sk-123"}
    assert "sk-123" not in " ".join(launch.argv) and "sk-123" not in repr(launch)


def test_no_key_no_secret_env() -> None:
    assert engine_launch(_cfg(), host="h", port=1).secret_env == {}


def test_sglang_refuses_an_api_key() -> None:
    with pytest.raises(ConfigError, match="--api-key"):
        engine_launch(_cfg(engine={"kind": "sglang"}, api_key="k"), host="h", port=1)


def test_engine_python_default() -> None:
    assert engine_python(_cfg()) == sys.executable
