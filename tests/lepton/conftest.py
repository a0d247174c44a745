"""Fixtures for the Lepton backend: a loopback fake workspace and configs pointing at it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The SDK reads LEPTON_CACHE_DIR once, at import: keep it off the user's ~/.cache/lepton.
os.environ.setdefault("LEPTON_CACHE_DIR", tempfile.mkdtemp(prefix="lepton-cache-"))

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingBackend, ServingHandle, ServingPhase, ServingStatus
from prefect_swarm.testing.fake_lepton import FakeLepton
from prefect_swarm.testing.waiting import wait_until

API_KEY = "endpoint-key-7f3a9c1e5b"


@pytest.fixture
def fake_lepton(
    need_lepton_sdk: None, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[FakeLepton]:
    """A fake workspace on a free port; every process it started is stopped afterwards.

    Parametrize it indirectly with a dict of FakeLepton keyword arguments (its knobs)."""
    for key in (
        "LEPTON_WORKSPACE_ID",
        "LEPTON_WORKSPACE_TOKEN",
        "LEPTON_WORKSPACE_URL",
        "LEPTON_WORKSPACE_ORIGIN_URL",
    ):
        monkeypatch.delenv(key, raising=False)
    with FakeLepton(**getattr(request, "param", {})) as fake:
        yield fake
        fake.wait_deletes()
    assert fake.running_processes() == []


@pytest.fixture
def shared_dir(tmp_path: Path) -> Path:
    """The 'shared filesystem': mounted at the same path in the fake's containers."""
    path = tmp_path / "shared"
    path.mkdir()
    return path


@pytest.fixture
def lepton_cfg(fake_lepton: FakeLepton, shared_dir: Path) -> Callable[..., SwarmConfig]:
    """Build a SwarmConfig for the fake workspace; keyword overrides go to the backend section."""

    def make(name: str = "lep", api_key: str | None = API_KEY, **backend: Any) -> SwarmConfig:
        section: dict[str, Any] = {
            "type": "lepton",
            "workspace_id": fake_lepton.workspace_id,
            "workspace_url": fake_lepton.url,
            "token": fake_lepton.token,
            "mounts": [{"path": "/prefect-swarm", "mount_path": str(shared_dir)}],
            "shared_path": str(shared_dir / "runs"),
            "ready_poll_s": 0.1,
            "job_resource_shape": "cpu.small",
        }
        section.update(backend)
        data: dict[str, Any] = {
            "name": name,
            "model": "stub-model",
            "gpus_per_replica": 0,
            "backend": section,
        }
        if api_key is not None:
            data["api_key"] = api_key
        return SwarmConfig.model_validate(data)

    return make


KnownStatus = Callable[[ServingBackend, ServingHandle], ServingStatus]


@pytest.fixture
def known_status() -> KnownStatus:
    """See :func:`_known_status`."""
    return _known_status


def _known_status(srv: ServingBackend, handle: ServingHandle, timeout_s: float = 20.0) -> ServingStatus:
    """The endpoint's status once the platform has looked at it: right after a create or an update a
    deployment reads the unknown state a few times (the fake does as the platform), and a user
    asking `prefect-swarm status` again sees the state it settles in. Waits on that state."""
    return wait_until(
        "a known phase",
        lambda: srv.status(handle),
        until=lambda st: st.phase is not ServingPhase.UNKNOWN,
        timeout_s=timeout_s,
        poll_s=0.05,
    )
