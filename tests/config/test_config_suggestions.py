"""Unknown keys are named with their full path and, when close to a real key, a "Did you mean"."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_swarm.config import load_config
from prefect_swarm.exceptions import ConfigError

BASE: dict[str, Any] = {"name": "typo", "model": "tiny"}


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(data={**BASE, **data}, environ={}, use_defaults_file=False)
    return str(info.value)


@pytest.mark.parametrize(
    ("data", "path", "suggestion"),
    [
        ({"replica": 2}, "replica", "replicas"),
        ({"servd_model_name": "x"}, "servd_model_name", "served_model_name"),
        ({"engine": {"comand": ["x"]}}, "engine.comand", "command"),
        ({"engine": {"startup_timeout": 5}}, "engine.startup_timeout", "startup_timeout_s"),
        ({"backend": {"type": "slurm", "acount": "a"}}, "backend.acount", "account"),
        ({"backend": {"type": "slurm", "container": {"imag": "x.sif"}}}, "backend.container.imag", "image"),
        ({"backend": {"type": "local", "max_restart": 1}}, "backend.max_restart", "max_restarts"),
        (
            {"backend": {"type": "lepton", "workspace_id": "w", "resource_shap": "x"}},
            "backend.resource_shap",
            "resource_shape",
        ),
        (
            {
                "backend": {
                    "type": "lepton",
                    "workspace_id": "w",
                    "mounts": [{"path": "/a", "mount_pth": "/b"}],
                }
            },
            "backend.mounts.0.mount_pth",
            "mount_path",
        ),
    ],
)
def test_did_you_mean(data: dict[str, Any], path: str, suggestion: str) -> None:
    msg = _error(data)
    assert f"{path}: unknown key" in msg
    assert f"Did you mean '{suggestion}'?" in msg


def test_far_off_key_lists_the_valid_keys() -> None:
    msg = _error({"engine": {"zzzzzz": 1}})
    assert "engine.zzzzzz: unknown key" in msg
    assert "Valid keys here:" in msg and "health_path" in msg


def test_unknown_backend_type_lists_the_valid_ones() -> None:
    msg = _error({"backend": {"type": "slrum"}})
    assert "backend type 'slrum' is not valid; choose one of local, slurm, lepton, external" in msg


def test_secret_values_are_never_echoed() -> None:
    msg = _error({"api_key": ["s3cr3t-value"], "backend": {"type": "lepton", "workspace_id": "w", "token": 424242}})
    assert "api_key" in msg and "backend.token" in msg
    assert "s3cr3t" not in msg and "424242" not in msg


def test_every_problem_is_listed_at_once() -> None:
    msg = _error({"replicas": 0, "port": 0, "engine": {"kind": "tgi"}})
    assert "replicas:" in msg and "port:" in msg and "engine.kind:" in msg
