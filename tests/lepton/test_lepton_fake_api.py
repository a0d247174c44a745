"""The fake Lepton API itself, driven by the real SDK: auth, workspace routing, paging, secrets, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton


def _client(fake: FakeLepton, token: str | None = None, url: str | None = None):  # type: ignore[no-untyped-def]
    from leptonai.api.v2 import APIClient

    return APIClient(workspace_id=fake.workspace_id, auth_token=token or fake.token, url=url or fake.url)


def _job(name: str, command: list[str]):  # type: ignore[no-untyped-def]
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.deployment import LeptonContainer
    from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

    return LeptonJob(
        metadata=Metadata(id=name, name=name, labels={"team": "a" if name < "job-3" else "b"}),
        spec=LeptonJobUserSpec(resource_shape="cpu.small", container=LeptonContainer(image="x", command=command)),
    )


def test_jobs_page_and_filter(fake_lepton: FakeLepton) -> None:
    api = _client(fake_lepton)
    ids = [api.job.create(_job(f"job-{i}", [sys.executable, "-c", "pass"])).metadata.id_ for i in range(5)]
    assert [j.metadata.name for j in api.job.list_all()] == [f"job-{i}" for i in range(5)]  # pages until empty
    assert [j.metadata.name for j in api.job.list_all(page=2, page_size=2)] == ["job-2", "job-3"]
    assert [j.metadata.name for j in api.job.list_all(query="team=b")] == ["job-3", "job-4"]
    assert [j.metadata.name for j in api.job.list_all(q="job-1")] == ["job-1"]  # q: a part of the name
    for jid in ids:
        api.job.delete(jid)
    fake_lepton.wait_deletes()  # Deleting, then gone
    assert api.job.list_all() == []


def test_auth_and_workspace_routing(fake_lepton: FakeLepton) -> None:
    from leptonai.api.v2.api_resource import ClientError

    with pytest.raises(ClientError) as err:
        _client(fake_lepton, token="wrong").job.get("x")
    assert err.value.response.status_code == 401
    with pytest.raises(ClientError) as err:
        _client(fake_lepton, url=fake_lepton.url.replace(fake_lepton.workspace_id, "nope")).job.get("x")
    assert err.value.response.status_code == 404
    root = fake_lepton.url.split("/api/v2")[0]  # the SDK may also be pointed at the bare host
    assert _client(fake_lepton, url=root).info().workspace_name == fake_lepton.workspace_id


def test_secrets_are_write_only(fake_lepton: FakeLepton) -> None:
    from leptonai.api.v2.types.secret import SecretItem

    api = _client(fake_lepton)
    api.secret.create([SecretItem(name="A_KEY", value="v1")])
    assert [(s.name, s.value) for s in api.secret.list_all()] == [("A_KEY", None)]
    api.secret.delete("A_KEY")
    assert api.secret.list_all() == []


def test_module_entry_point(need_lepton_sdk: None, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect_swarm.testing.fake_lepton", "--token", "tok-1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "LEPTON_CACHE_DIR": str(tmp_path)},
    )
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert info["token"] == "tok-1" and info["workspace_id"] == "ws-test"
        import httpx

        resp = httpx.get(info["url"] + "/workspace", headers={"Authorization": "Bearer tok-1"}, timeout=5)
        assert resp.status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(10) == 0 or proc.returncode == -15
