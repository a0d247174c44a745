"""A swarm owns its name on a shared workspace: what it makes carries its identity (this home's), and
`up`, `down`, scale and the reaper take over or delete nothing without it."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prefect_swarm.backends.lepton.client import LABEL_OWNER, OWNER_ENV, swarm_owner
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobRequest, JobStatus
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]
Cli = Callable[..., subprocess.CompletedProcess[str]]


def _chat(url: str, key: str) -> int:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10).status_code


def _config_file(cfg: SwarmConfig, path: Path) -> Path:
    """``cfg`` as a YAML file a user would write (the token from the environment, not the file)."""
    data = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["backend"].pop("token", None)
    data["api_key"] = cfg.api_key.get_secret_value() if cfg.api_key else None
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return path


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> dict[str, str]:
    home = tmp_path / f"home-{which}"
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(home))
    return {"PREFECT_SWARM_HOME": str(home)}


def _writes(fake: FakeLepton) -> list[tuple[str, str, int]]:
    """Requests that create, change or delete a deployment."""
    return [r for r in fake.requests if r[0] in ("POST", "PATCH", "DELETE") and "/deployments" in r[1]]


def test_two_homes_one_name_the_second_up_is_refused_and_the_first_is_untouched(
    lepton_cfg: Make, fake_lepton: FakeLepton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Cli
) -> None:
    _home(tmp_path, monkeypatch, "a")
    first = Swarm(lepton_cfg(api_key="key-of-a"))
    first.up()
    url = first.wait_ready().url or ""
    owner_a = swarm_owner(SwarmPaths.for_swarm("lep"))
    dep = fake_lepton.deployments["lep"]
    assert dep.body["metadata"]["labels"][LABEL_OWNER] == owner_a
    assert {"name": OWNER_ENV, "value": owner_a} in dep.body["spec"]["envs"]
    compute = first.compute
    job = compute.submit(JobRequest(name="echo", command=["python3", "-c", "import time; time.sleep(1)"]))
    assert all(j.body["metadata"]["labels"][LABEL_OWNER] == owner_a for j in fake_lepton.jobs.values())
    assert _chat(url, "key-of-a") == 200
    body, secrets, writes = copy.deepcopy(dep.body), dict(fake_lepton.secrets), len(_writes(fake_lepton))

    # another user (another PREFECT_SWARM_HOME) brings up a swarm of the same name: refused at once
    env = _home(tmp_path, monkeypatch, "b")
    cfg_b = lepton_cfg(api_key="key-of-b")
    done = run_cli(
        "up",
        "-c",
        str(_config_file(cfg_b, tmp_path / "b.yaml")),
        env={**env, "LEPTON_WORKSPACE_TOKEN": fake_lepton.token},
    )
    assert done.returncode == 2, done.stderr
    err = " ".join(done.stderr.split())
    assert "name 'lep' is taken by a Lepton endpoint not made by this swarm" in err
    assert f"made by the prefect-swarm swarm '{owner_a}'" in err and "pick another name or `--adopt`" in err
    # ... and its teardown (a failed `up` tears down what it started) deleted nothing of the first
    assert len(_writes(fake_lepton)) == writes
    assert fake_lepton.deployments["lep"].body == body and fake_lepton.secrets == secrets
    assert fake_lepton.jobs and all(not j.stopped for j in fake_lepton.jobs.values())
    assert _chat(url, "key-of-a") == 200 and _chat(url, "key-of-b") == 401
    # the second home's `down` and a scale through it leave it too
    second = Swarm(cfg_b)
    second.down()
    with pytest.raises(Exception, match="not made by this swarm"):
        Swarm(cfg_b.model_copy(update={"replicas": 3})).up()
    assert fake_lepton.deployments["lep"].body == body and _chat(url, "key-of-a") == 200

    _home(tmp_path, monkeypatch, "a")
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    first.down()
    assert fake_lepton.deployments == {} and fake_lepton.secrets == {}
    assert all(j.stopped or not j.alive() for j in fake_lepton.jobs.values())


def _hand_made(fake: FakeLepton, name: str) -> dict[str, Any]:
    """An endpoint made with the SDK by hand (as `lep endpoint create` would): no prefect-swarm marks."""
    from leptonai.api.v2.client import APIClient
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.deployment import (
        ContainerPort,
        LeptonContainer,
        LeptonDeployment,
        LeptonDeploymentUserSpec,
        ResourceRequirement,
        TokenVar,
    )

    api = APIClient(workspace_id=fake.workspace_id, auth_token=fake.token, url=fake.url)
    spec = LeptonDeployment(
        metadata=Metadata(id=name, name=name),
        spec=LeptonDeploymentUserSpec(
            container=LeptonContainer(
                image="my/own:1",
                command=["python3", "-m", "server", "--served-model-name", "prod"],
                ports=[ContainerPort(container_port=8080)],
            ),
            resource_requirement=ResourceRequirement(resource_shape="cpu.small", min_replicas=1, max_replicas=1),
            api_tokens=[TokenVar(value="hand-made-key")],
        ),
    )
    api.deployment.create_with_response(spec, tolerate_legacy_response=True)
    return copy.deepcopy(fake.deployments[name].body)


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_a_hand_made_endpoint_survives_up_and_down_of_a_swarm_of_its_name(
    lepton_cfg: Make, fake_lepton: FakeLepton
) -> None:
    body = _hand_made(fake_lepton, "prod")
    swarm = Swarm(lepton_cfg(name="prod"))
    with pytest.raises(
        Exception, match=r"(?s)taken by a Lepton endpoint not made by this swarm \(no prefect-swarm owner mark"
    ):
        swarm.up()
    swarm.down()
    assert fake_lepton.deployments["prod"].body == body
    assert StateStore().require_swarm("prod").phase.name in ("FAILED", "STOPPED")


def test_up_adopt_on_the_command_line_takes_a_hand_made_endpoint_over(
    lepton_cfg: Make, fake_lepton: FakeLepton, tmp_path: Path, run_cli: Cli
) -> None:
    _hand_made(fake_lepton, "prod")
    config = _config_file(lepton_cfg(name="prod", storage_check_timeout_s=None), tmp_path / "prod.yaml")
    env = {"LEPTON_WORKSPACE_TOKEN": fake_lepton.token}
    refused = run_cli("up", "-c", str(config), env=env)
    assert refused.returncode == 2 and "pick another name or `--adopt`" in " ".join(refused.stderr.split())
    adopted = run_cli("up", "-c", str(config), "--adopt", env=env)
    assert adopted.returncode == 0, adopted.stderr
    owner = swarm_owner(SwarmPaths.for_swarm("prod"))
    dep = fake_lepton.deployments["prod"]
    assert dep.body["metadata"]["labels"][LABEL_OWNER] == owner and dep.body["spec"]["container"]["image"] != "my/own:1"
    assert run_cli("down", "prod", "--yes", env=env).returncode == 0
    fake_lepton.wait_deletes()
    assert fake_lepton.deployments == {}


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_adopt_takes_a_name_over_and_marks_it(
    lepton_cfg: Make, fake_lepton: FakeLepton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _home(tmp_path, monkeypatch, "a")
    first = Swarm(lepton_cfg(api_key="key-of-a"))
    first.up()
    owner_a = swarm_owner(SwarmPaths.for_swarm("lep"))
    _home(tmp_path, monkeypatch, "b")
    cfg_b = lepton_cfg(api_key="key-of-b", adopt=True)
    second = Swarm(cfg_b)
    second.up()
    url = second.wait_ready().url or ""
    owner_b = swarm_owner(SwarmPaths.for_swarm("lep"))
    assert owner_b != owner_a
    dep = fake_lepton.deployments["lep"]
    assert {"name": OWNER_ENV, "value": owner_b} in dep.body["spec"]["envs"]
    if not fake_lepton.new_deployment_api:
        assert dep.body["metadata"]["labels"][LABEL_OWNER] == owner_b
    assert _chat(url, "key-of-b") == 200 and _chat(url, "key-of-a") == 401
    # now it is the second's: the first's `down` leaves it, the second's deletes it
    _home(tmp_path, monkeypatch, "a")
    first.down()
    assert "lep" in fake_lepton.deployments
    _home(tmp_path, monkeypatch, "b")
    Swarm(lepton_cfg(api_key="key-of-b")).up()  # its own: reconciled without --adopt
    second.down()
    assert fake_lepton.deployments == {}


def _route(fake: FakeLepton) -> str:
    return "/endpoints" if fake.new_deployment_api else "/deployments"


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_a_504_on_the_endpoint_create_adopts_the_endpoint_it_made(
    lepton_cfg: Make, fake_lepton: FakeLepton, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setenv("PREFECT_SWARM_LEPTON_API_BACKOFF_S", "0.01")
    fake_lepton.inject(504, count=1, match=_route(fake_lepton), method="POST", apply=True)  # made; the answer lost
    swarm = Swarm(lepton_cfg())
    swarm.up()
    assert swarm.wait_ready().phase.name == "RUNNING"
    posts = [s for m, p, s in fake_lepton.requests if m == "POST" and p.endswith(_route(fake_lepton))]
    assert posts == [504, 409]  # the retry met the endpoint its first try made: ours, adopted
    assert list(fake_lepton.deployments) == ["lep"]
    swarm.down()
    assert fake_lepton.deployments == {}


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_an_endpoint_made_by_a_create_that_then_failed_is_cleaned(
    lepton_cfg: Make, fake_lepton: FakeLepton, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_swarm.backends.lepton.client import LeptonClient
    from prefect_swarm.backends.lepton.serving import LeptonServing
    from prefect_swarm.exceptions import BackendError

    monkeypatch.setenv("PREFECT_SWARM_LEPTON_API_BACKOFF_S", "0.01")
    route = _route(fake_lepton)
    fake_lepton.inject(504, count=1, match=route, method="POST", apply=True)  # went through...
    fake_lepton.inject(503, count=LeptonClient.attempts, match=route, method="POST")  # ...every retry refused
    cfg = lepton_cfg(storage_check_timeout_s=None)
    with pytest.raises(BackendError, match="stayed unavailable while trying to create deployment 'lep'"):
        LeptonServing(cfg, SwarmPaths.for_swarm("lep")).create_or_update(cfg)
    # the one try that went through made an endpoint nobody wants: deleted by the failed create itself
    fake_lepton.wait_deletes()  # deletes finish in the background, as on the platform
    assert fake_lepton.deployments == {}
    assert any(m == "DELETE" and p.endswith(f"{route}/lep") for m, p, _s in fake_lepton.requests)
