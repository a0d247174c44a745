"""The workspace's catalogs as the platform serves them (each node group its own volumes and
shapes, entries the SDK cannot read, secrets the API does not refuse to overwrite) and the
scheduling options a batch user sets (node groups, reservation, priority, preemption, passthrough)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from prefect_swarm.backends.lepton.client import LeptonClient
from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import JobRequest
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]
TWO_GROUPS = {"ng-a": "pool-a", "ng-b": "pool-b"}


def serving(cfg: SwarmConfig) -> LeptonServing:
    return LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))


def _up_spec(cfg: SwarmConfig, fake: FakeLepton) -> dict:
    """Create the endpoint (no storage check) and return the spec the fake received; deleted after."""
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    spec = fake.deployments[cfg.name].body["spec"]
    srv.delete(handle)
    return spec


# ---------------------------------------------------------------------------------- secrets
def test_an_existing_secret_is_kept_though_the_api_would_overwrite_it(
    lepton_cfg: Make, fake_lepton: FakeLepton
) -> None:
    client = LeptonClient(lepton_cfg().backend)  # type: ignore[arg-type]
    client.ensure_secret("SHARED_KEY", "first")
    client.ensure_secret("SHARED_KEY", "second")  # another submit: the existing one stays
    assert fake_lepton.secrets["SHARED_KEY"] == "first"
    client.ensure_secret("SHARED_KEY", "third", replace=True)
    assert fake_lepton.secrets["SHARED_KEY"] == "third"
    posts = [s for m, p, s in fake_lepton.requests if m == "POST" and p.endswith("/usersecrets")]
    assert posts == [200, 200]  # never posted over an existing name


def test_the_fake_overwrites_a_secret_posted_again(fake_lepton: FakeLepton) -> None:
    from leptonai.api.v2 import APIClient
    from leptonai.api.v2.types.secret import SecretItem

    api = APIClient(workspace_id=fake_lepton.workspace_id, auth_token=fake_lepton.token, url=fake_lepton.url)
    api.secret.create([SecretItem(name="K", value="v1")])
    api.secret.create([SecretItem(name="K", value="v2")])  # no 409
    assert fake_lepton.secrets == {"K": "v2"}


def test_hf_token_goes_by_secret_reference(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    plain = lepton_cfg(storage_check_timeout_s=None).model_copy(update={"env": {"HF_TOKEN": "hf_plain"}})
    with pytest.raises(ConfigError, match=r"HF_TOKEN would sit in plain text.*backend.secret_env"):
        serving(plain).create_or_update(plain)
    cfg = lepton_cfg(storage_check_timeout_s=None, secret_env={"HF_TOKEN": "hf-token"})
    with pytest.raises(ConfigError, match=r"backend.secret_env.HF_TOKEN: workspace 'ws-test' has no secret 'hf-token'"):
        serving(cfg).create_or_update(cfg)
    assert fake_lepton.deployments == {} and fake_lepton.requests
    fake_lepton.secrets["hf-token"] = "hf_in_the_workspace"
    spec = _up_spec(cfg, fake_lepton)
    assert {"name": "HF_TOKEN", "value_from": {"secret_name_ref": "hf-token"}} in spec["envs"]
    assert "hf_in_the_workspace" not in str(spec)


# ---------------------------------------------------------------------------------- catalogs
@pytest.mark.parametrize(
    "fake_lepton", [{"node_groups": TWO_GROUPS, "malformed_node_groups": ("ng-b",)}], indirect=True
)
def test_a_node_group_the_sdk_cannot_read_is_warned_about_not_refused(
    lepton_cfg: Make, fake_lepton: FakeLepton, caplog: pytest.LogCaptureFixture
) -> None:
    from leptonai.api.v2 import APIClient

    api = APIClient(workspace_id=fake_lepton.workspace_id, auth_token=fake_lepton.token, url=fake_lepton.url)
    assert [g.metadata.id_ for g in api.nodegroup.list_all()] == ["ng-a"]  # the SDK skips ng-b
    caplog.set_level(logging.WARNING)
    cfg = lepton_cfg(storage_check_timeout_s=None, node_groups=["ng-b"])
    spec = _up_spec(cfg, fake_lepton)
    assert spec["resource_requirement"]["affinity"]["allowed_dedicated_node_groups"] == ["ng-b"]
    assert "node group 'ng-b'" in caplog.text and "cannot read its catalog entry" in caplog.text


@pytest.mark.parametrize(
    "fake_lepton",
    [{"node_groups": TWO_GROUPS, "group_volumes": {"ng-a": ("node-nfs:lepton-shared-fs",), "ng-b": ()}}],
    indirect=True,
)
def test_volumes_are_per_node_group(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(storage_check_timeout_s=None, node_groups=["ng-b"])
    with pytest.raises(ConfigError, match=r"backend.mounts\[0\].from: .*no volume 'node-nfs:lepton-shared-fs'"):
        serving(cfg).create_or_update(cfg)
    both = lepton_cfg(storage_check_timeout_s=None, node_groups=["ng-a", "ng-b"])
    with pytest.raises(ConfigError, match=r"on node group 'ng-b'.*Each node group has its own volumes"):
        serving(both).create_or_update(both)
    assert fake_lepton.deployments == {}
    _up_spec(lepton_cfg(storage_check_timeout_s=None, node_groups=["ng-a"]), fake_lepton)


@pytest.mark.parametrize(
    "fake_lepton", [{"volumes": {"node-weka:shared": None, "node-nfs:lepton-shared-fs": None}}], indirect=True
)
def test_a_volume_type_the_sdk_does_not_know_matches_only_its_own_type(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path
) -> None:
    def cfg(source: str) -> SwarmConfig:
        mount = {"from": source, "path": "/prefect-swarm", "mount_path": str(shared_dir)}
        return lepton_cfg(storage_check_timeout_s=None, mounts=[mount])

    wrong = cfg("node-nfs:shared")  # the SDK reads the weka volume as type UNK
    with pytest.raises(ConfigError, match=r"no volume 'node-nfs:shared'.*node-weka:shared"):
        serving(wrong).create_or_update(wrong)
    assert _up_spec(cfg("node-weka:shared"), fake_lepton)["mounts"][0]["from"] == "node-weka:shared"


@pytest.mark.parametrize(
    "fake_lepton",
    [{"node_groups": TWO_GROUPS, "group_shapes": {"ng-a": ("gpu.h100-sxm", "cpu.small"), "ng-b": ("cpu.small",)}}],
    indirect=True,
)
def test_shapes_are_per_node_group_and_named_by_spec_name(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(storage_check_timeout_s=None, node_groups=["ng-b"], resource_shape="gpu.h100-sxm")
    with pytest.raises(
        ConfigError, match=r"backend.resource_shape: .* on node groups ng-b has no resource shape 'gpu.h100-sxm'"
    ):
        serving(cfg).create_or_update(cfg)
    ok = lepton_cfg(storage_check_timeout_s=None, node_groups=["ng-a"], resource_shape="gpu.h100-sxm")
    assert _up_spec(ok, fake_lepton)["resource_requirement"]["resource_shape"] == "gpu.h100-sxm"
    shapes = [p for m, p, s in fake_lepton.requests if p.endswith("/shapes")]
    assert shapes  # and the shape ids the API gives are not the names:
    from leptonai.api.v2 import APIClient

    api = APIClient(workspace_id=fake_lepton.workspace_id, auth_token=fake_lepton.token, url=fake_lepton.url)
    listed = api.shapes.list_shapes(node_group="pool-a", purpose="deployment")  # the SDK's filter takes names
    assert {s.spec.name for s in listed} == {"gpu.h100-sxm", "cpu.small"}
    assert api.shapes.list_shapes(node_group="ng-a", purpose="deployment") == []  # an id matches nothing
    assert not {s.metadata.id_ for s in listed} & {"gpu.h100-sxm", "cpu.small"}


# ---------------------------------------------------------------------------------- scheduling options
def test_queue_options_need_node_groups_and_a_known_priority(lepton_cfg: Make) -> None:
    with pytest.raises(ValidationError, match=r"job_priority need.* node_groups"):
        lepton_cfg(job_priority="high")
    with pytest.raises(ValidationError, match=r"reservation need.* node_groups"):
        lepton_cfg(reservation="res-1")
    with pytest.raises(ValidationError, match="'urgent' is not a Lepton queue priority"):
        lepton_cfg(node_groups=["ng-7f3a9c"], job_priority="urgent")
    assert lepton_cfg(node_groups=["ng-7f3a9c"], job_priority=8).backend.job_priority == "high-8000"  # type: ignore[union-attr]


def test_priority_preemption_reservation_and_passthrough_reach_the_specs(
    lepton_cfg: Make, fake_lepton: FakeLepton
) -> None:
    cfg = lepton_cfg(
        storage_check_timeout_s=None,
        node_groups=["ng-7f3a9c"],
        reservation="res-42",
        job_priority="low",
        job_preemptible=True,
        deployment_spec={"ingress_timeout_seconds": 900, "resource_requirement": {"shared_memory_size": 2048}},
        job_spec={"shared_memory_size": 512, "max_job_failure_retry": 2},
    )
    spec = _up_spec(cfg, fake_lepton)
    assert spec["reservation_config"] == {"reservation_id": "res-42"}
    assert spec["ingress_timeout_seconds"] == 900
    assert spec["resource_requirement"]["shared_memory_size"] == 2048
    assert spec["resource_requirement"]["min_replicas"] == 1  # ours, merged, not replaced
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    job = compute.submit(JobRequest(name="opts", command=[compute.job_runtime().python, "-c", "pass"]))
    body = fake_lepton.jobs[job.id].body["spec"]
    assert body["queue_config"] == {"priority_class": "low-1000", "can_be_preempted": True}
    assert body["reservation_config"] == {"reservation_id": "res-42"}
    assert body["shared_memory_size"] == 512 and body["max_job_failure_retry"] == 2


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"deployment_spec": {"envs": []}}, r"backend.deployment_spec.envs: prefect-swarm sets this field itself"),
        (
            {"deployment_spec": {"resource_requirement": {"min_replicas": 5}}},
            r"deployment_spec.resource_requirement.min_replicas: prefect-swarm sets",
        ),
        ({"job_spec": {"no_such_field": 1}}, r"backend.job_spec.no_such_field: not a field of the Lepton SDK"),
        ({"deployment_spec": {"ingress_timeout_seconds": 5}}, r"backend.deployment_spec: the Lepton SDK refuses"),
    ],
)
def test_bad_passthrough_is_refused_before_any_call(
    lepton_cfg: Make, fake_lepton: FakeLepton, extra: dict, said: str
) -> None:
    cfg = lepton_cfg(**extra)
    with pytest.raises(ConfigError, match=said):
        serving(cfg).create_or_update(cfg)
    assert fake_lepton.requests == []
