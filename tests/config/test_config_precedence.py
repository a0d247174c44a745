"""Config precedence, each layer proven: built-in < defaults file < YAML < PREFECT_SWARM_* env < CLI flags."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefect_swarm.config import load_config

BASE = {"name": "prec", "model": "tiny", "engine": {"kind": "command", "command": ["{python}", "-V"]}}

# replicas value each layer sets; the highest present layer must win
LAYERS = ["builtin", "defaults_file", "yaml", "env", "cli"]
VALUE = {"builtin": 1, "defaults_file": 2, "yaml": 3, "env": 4, "cli": 5}


def _setup(top: str, home: Path, tmp_path: Path) -> tuple[Path, dict[str, str], dict[str, Any]]:
    upto = LAYERS[: LAYERS.index(top) + 1]
    if "defaults_file" in upto:
        (home / "defaults.yaml").write_text(yaml.safe_dump({"replicas": VALUE["defaults_file"]}))
    data = dict(BASE)
    if "yaml" in upto:
        data["replicas"] = VALUE["yaml"]
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {"PREFECT_SWARM_REPLICAS": str(VALUE["env"])} if "env" in upto else {}
    overrides = {"replicas": VALUE["cli"]} if "cli" in upto else {}
    return path, env, overrides


@pytest.mark.parametrize("top", LAYERS)
def test_each_layer_beats_the_ones_below(top: str, swarm_home: Path, tmp_path: Path) -> None:
    path, env, overrides = _setup(top, swarm_home, tmp_path)
    cfg = load_config(path, overrides, environ=env)
    assert cfg.replicas == VALUE[top]


def test_layers_merge_field_by_field(swarm_home: Path, tmp_path: Path) -> None:
    (swarm_home / "defaults.yaml").write_text(
        yaml.safe_dump({"port": 9100, "engine": {"args": ["--from-defaults"]}, "backend": {"max_restarts": 7}})
    )
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump({**BASE, "replicas": 3, "backend": {"type": "local", "host": "127.0.0.2"}}))
    env = {"PREFECT_SWARM_BACKEND__MAX_RESTARTS": "9", "PREFECT_SWARM_ENV__HF_HOME": "/data/hf"}
    cfg = load_config(path, {"name": "from-cli"}, environ=env)
    assert cfg.port == 9100  # defaults file, untouched above
    assert cfg.engine.args == ["--from-defaults"]  # nested key from the defaults file survives the YAML's engine
    assert cfg.engine.kind == "command"  # YAML
    assert cfg.replicas == 3  # YAML
    assert cfg.backend.host == "127.0.0.2"  # type: ignore[union-attr]  # YAML, nested
    assert cfg.backend.max_restarts == 9  # type: ignore[union-attr]  # env beats defaults file, nested
    assert cfg.env == {"HF_HOME": "/data/hf"}  # env; the key keeps its case
    assert cfg.name == "from-cli"  # CLI flag
    assert cfg.gpus_per_replica == 1  # built-in default


def test_a_backend_of_another_type_replaces_the_lower_one(swarm_home: Path, tmp_path: Path) -> None:
    (swarm_home / "defaults.yaml").write_text(yaml.safe_dump({"backend": {"type": "slurm", "partition": "gpu"}}))
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump({**BASE, "backend": {"type": "local"}}))
    cfg = load_config(path, environ={})
    assert cfg.backend.type == "local"  # and partition did not leak into the local config


def test_settings_variables_are_not_config(swarm_home: Path, tmp_path: Path) -> None:
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(path, environ={"PREFECT_SWARM_HOME": "/x", "PREFECT_SWARM_LOG_LEVEL": "DEBUG"})
    assert cfg.name == "prec"


# ---------------------------------------------------------------- through the real CLI
def _cli_replicas_error(run_cli: Callable[..., Any], path: Path, *flags: str, env: dict[str, str]) -> str:
    result = run_cli("validate", "-c", str(path), *flags, env=env)
    assert result.returncode == 2, result.stderr
    return str(result.stderr)


def test_cli_layers_proven_by_the_value_that_fails(
    run_cli: Callable[..., Any], swarm_home: Path, tmp_path: Path
) -> None:
    """Each layer sets an invalid replicas value in turn; the error shows which value won.

    Backend-independent: validation fails before any backend is loaded.
    """
    path = tmp_path / "swarm.yaml"
    (swarm_home / "defaults.yaml").write_text(yaml.safe_dump({"replicas": -2}))
    path.write_text(yaml.safe_dump(BASE))
    assert "(got -2)" in _cli_replicas_error(run_cli, path, env={})  # defaults file beats built-in 1
    path.write_text(yaml.safe_dump({**BASE, "replicas": -3}))
    assert "(got -3)" in _cli_replicas_error(run_cli, path, env={})  # YAML beats defaults file
    env = {"PREFECT_SWARM_REPLICAS": "-4"}
    err = _cli_replicas_error(run_cli, path, env=env)
    assert "(got -4)" in err and "PREFECT_SWARM_REPLICAS" in err  # env beats YAML, and is named
    assert "(got -5)" in _cli_replicas_error(run_cli, path, "--replicas", "-5", env=env)  # flag beats env


@pytest.mark.parametrize("top", LAYERS)
def test_cli_validate_json_shows_the_winning_layer(
    top: str, run_cli: Callable[..., Any], swarm_home: Path, tmp_path: Path
) -> None:
    path, env, overrides = _setup(top, swarm_home, tmp_path)
    flags = ["--replicas", str(overrides["replicas"])] if overrides else []
    result = run_cli("validate", "-c", str(path), "-o", "json", *flags, env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert doc["config"]["replicas"] == VALUE[top]
