"""Lepton: no replica /metrics (n/a with the reason); GPU-hours from the deployment's age, priced per shape."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("LEPTON_CACHE_DIR", tempfile.mkdtemp(prefix="lepton-cache-"))

from prefect_swarm.backends.registry import build_backends
from prefect_swarm.config import SwarmConfig
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = [pytest.mark.lepton]


@pytest.fixture
def fake(need_lepton_sdk: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLepton]:
    for key in ("LEPTON_WORKSPACE_ID", "LEPTON_WORKSPACE_TOKEN", "LEPTON_WORKSPACE_URL", "LEPTON_WORKSPACE_ORIGIN_URL"):
        monkeypatch.delenv(key, raising=False)
    with FakeLepton() as f:
        yield f
    assert f.running_processes() == []


def test_lepton_metrics_na_and_gpu_hours_priced_per_shape(fake: FakeLepton, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    cfg = SwarmConfig.model_validate(
        {
            "name": "lep-cost",
            "model": "stub-model",
            "replicas": 2,
            "gpus_per_replica": 1,
            "backend": {
                "type": "lepton",
                "workspace_id": fake.workspace_id,
                "workspace_url": fake.url,
                "token": fake.token,
                "mounts": [{"path": "/prefect-swarm", "mount_path": str(shared)}],
                "shared_path": str(shared / "runs"),
                "ready_poll_s": 0.1,
                "resource_shape": "gpu.h100-sxm",
                "cost": {"gpu_hour_usd": 1.0, "per_shape": {"gpu.h100-sxm": 3.6}},
            },
        }
    )
    serving = build_backends(cfg, SwarmPaths.for_swarm(cfg.name)).serving
    handle = serving.create_or_update(cfg)
    try:
        targets = serving.metrics_targets(handle)
        assert targets.targets == () and targets.reason
        time.sleep(1.0)
        usage = serving.gpu_usage(handle)
        assert usage.shape == "gpu.h100-sxm" and usage.gpus == 2
        assert usage.gpu_hours is not None and 2 * 1.0 / 3600 <= usage.gpu_hours < 2 * 60 / 3600
        assert cfg.backend.cost.figures(usage.gpu_hours, shape=usage.shape)["usd"] == round(usage.gpu_hours * 3.6, 4)
    finally:
        serving.delete(handle)
    gone = serving.gpu_usage(handle)
    assert gone.gpu_hours is None and "gone" in (gone.reason or "")
