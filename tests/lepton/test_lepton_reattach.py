"""Reattaching to a Lepton swarm: the secrets its record dropped come from the environment, else
from the config it came from (its SwarmSpec block). The flow itself, through the real Prefect
server and worker, is in ``tests/prefect/test_lepton_flow.py``."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.swarm import missing_secrets, restore_secrets


def _cfg(**backend: Any) -> SwarmConfig:
    section = {"type": "lepton", "workspace_id": "ws-a", "token": "tok-block-1234", **backend}
    return SwarmConfig.model_validate(
        {"name": "lep", "model": "m", "gpus_per_replica": 0, "api_key": "key-block-5678", "backend": section}
    )


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("LEPTON_WORKSPACE_TOKEN", "PREFECT_SWARM_API_KEY", "MY_TOKEN"):
        monkeypatch.delenv(key, raising=False)


def test_record_has_no_secret_and_the_source_restores_them() -> None:
    cfg = _cfg()
    record = cfg.redacted()
    assert missing_secrets(record) == ["api_key", "backend.token"]
    back = SwarmConfig.model_validate(restore_secrets(record, cfg))
    assert back.api_key is not None and back.api_key.get_secret_value() == "key-block-5678"
    assert back.backend.token.get_secret_value() == "tok-block-1234"  # type: ignore[union-attr]
    assert SwarmConfig.model_validate(restore_secrets(record)).backend.token is None  # type: ignore[union-attr]


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(token_env="MY_TOKEN")
    monkeypatch.setenv("MY_TOKEN", "tok-env")
    monkeypatch.setenv("PREFECT_SWARM_API_KEY", "key-env")
    record = cfg.redacted()
    assert missing_secrets(record) == []
    back = SwarmConfig.model_validate(restore_secrets(record, cfg))
    assert back.api_key.get_secret_value() == "key-env"  # type: ignore[union-attr]
    assert back.backend.token is None  # type: ignore[union-attr]  # the backend reads $MY_TOKEN itself


def test_a_token_of_another_workspace_is_not_used() -> None:
    record = _cfg().redacted()
    other = _cfg(workspace_id="ws-b")
    back = SwarmConfig.model_validate(restore_secrets(record, other))
    assert back.backend.token is None  # type: ignore[union-attr]
