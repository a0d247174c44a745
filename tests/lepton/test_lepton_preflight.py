"""The pre-flight refuses what the workspace lacks before any endpoint or job is created: node
groups (the API takes ids), volumes (on the workspace's node groups), image-pull secrets; a
malformed volume name is refused by ``validate`` without calling the workspace at all."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import NODE_GROUPS, FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]
NG_ID, NG_NAME = next(iter(NODE_GROUPS.items()))


def _up(cfg: SwarmConfig) -> None:
    srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
    srv.create_or_update(cfg)


def _nothing_created(fake: FakeLepton) -> None:
    assert fake.deployments == {} and fake.jobs == {}
    assert not [r for r in fake.requests if r[0] == "POST" and r[1].endswith(("/deployments", "/jobs"))]


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            {"node_groups": ["ng-nope"]},
            rf"backend.node_groups: workspace 'ws-test' has no node group 'ng-nope' \(by id or name\).*"
            rf"{NG_NAME} \(id {NG_ID}\)",
        ),
        ({"image_pull_secrets": ["regcred"]}, r"backend.image_pull_secrets: .* no image pull secret 'regcred'"),
    ],
    ids=["unknown-node-group", "unknown-pull-secret"],
)
def test_unknown_catalog_names_are_refused_before_anything_is_created(
    lepton_cfg: Make, fake_lepton: FakeLepton, backend: dict[str, object], message: str
) -> None:
    cfg = lepton_cfg(**backend)
    with pytest.raises(ConfigError, match=message):
        _up(cfg)
    _nothing_created(fake_lepton)


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_an_unknown_volume_is_refused_by_the_preflight(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path
) -> None:
    for source in ("node-nfs:other-fs", "no-such-volume"):
        cfg = lepton_cfg(mounts=[{"from": source, "path": "/prefect-swarm", "mount_path": str(shared_dir)}])
        with pytest.raises(ConfigError, match=rf"backend.mounts\[0\].from: .*no volume '{source}'.*lepton-shared-fs"):
            _up(cfg)
    _nothing_created(fake_lepton)


def test_known_names_pass_and_reach_the_specs(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.image_pull_secrets = ("regcred",)
    cfg = lepton_cfg(node_groups=[NG_ID], image_pull_secrets=["regcred"])
    srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
    handle = srv.create_or_update(cfg)
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["resource_requirement"]["affinity"]["allowed_dedicated_node_groups"] == [NG_ID]
    assert spec["image_pull_secrets"] == ["regcred"]
    srv.delete(handle)


def test_the_fake_refuses_unknown_node_groups_volumes_and_pull_secrets(fake_lepton: FakeLepton) -> None:
    """Without the pre-flight the API itself answers 400, as the platform does."""
    from leptonai.api.v2 import APIClient
    from leptonai.api.v2.api_resource import ClientError
    from leptonai.api.v2.types.affinity import LeptonResourceAffinity
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.deployment import LeptonContainer, Mount
    from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

    api = APIClient(workspace_id=fake_lepton.workspace_id, auth_token=fake_lepton.token, url=fake_lepton.url)
    for extra, said in (
        ({"affinity": LeptonResourceAffinity(allowed_dedicated_node_groups=[NG_NAME])}, "unknown node group id"),
        ({"image_pull_secrets": ["regcred"]}, "unknown image pull secret"),
        ({"mounts": [Mount(path="/a", mount_path="/mnt/a", **{"from": "no-such-volume"})]}, "unknown volume"),
    ):
        job = LeptonJob(
            metadata=Metadata(id="j", name="j"),
            spec=LeptonJobUserSpec(
                resource_shape="cpu.small", container=LeptonContainer(image="x", command=["true"]), **extra
            ),
        )
        with pytest.raises(ClientError, match="400") as err:
            api.job.create(job)
        assert said in err.value.response.text
    assert fake_lepton.jobs == {}
    assert [g.metadata.id_ for g in api.nodegroup.list_all()] == [NG_ID]


def test_a_malformed_volume_name_is_refused_by_validate_without_a_call(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path
) -> None:
    cfg = lepton_cfg(mounts=[{"from": "node-nfs", "path": "/prefect-swarm", "mount_path": str(shared_dir)}])
    with pytest.raises(ConfigError, match=r"backend.mounts\[0\].from: .*missing storage_name"):
        Swarm(cfg).validate()
    assert fake_lepton.requests == []


GROUPS = {"ng-a1b2c3": "h100-pool", "ng-d4e5f6": "cpu-pool"}


@pytest.mark.parametrize(
    "fake_lepton",
    [{"node_groups": GROUPS, "group_shapes": {"ng-a1b2c3": ("gpu.h100-sxm",), "ng-d4e5f6": ("cpu.small",)}}],
    indirect=True,
)
@pytest.mark.parametrize("given", [["h100-pool", "cpu-pool"], ["ng-a1b2c3", "ng-d4e5f6"], ["h100-pool", "ng-d4e5f6"]])
def test_node_groups_by_name_or_by_id_reach_the_specs_as_ids(
    lepton_cfg: Make, fake_lepton: FakeLepton, given: list[str]
) -> None:
    """The shapes of each group are found (the fake filters /shapes by group *name*, as the SDK
    documents: asked by id first, the backend falls back to the name), and every spec sent, the
    endpoint's, the storage check's and a job's, pins the ids."""
    from prefect_swarm.backends.lepton.compute import LeptonCompute
    from prefect_swarm.interfaces import JobRequest, JobStatus

    cfg = lepton_cfg(node_groups=given, resource_shape="gpu.h100-sxm", job_resource_shape="cpu.small")
    srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
    handle = srv.create_or_update(cfg)
    ids = ["ng-a1b2c3", "ng-d4e5f6"]
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["resource_requirement"]["affinity"]["allowed_dedicated_node_groups"] == ids
    shape_asks = [p for m, p, _s in fake_lepton.requests if m == "GET" and p.endswith("/shapes")]
    assert shape_asks  # the shapes were checked per group (by name where the id found none)
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), handle)
    job = compute.submit(JobRequest(name="echo", command=["python3", "-c", "print(1)"]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    assert all(j.body["spec"]["affinity"]["allowed_dedicated_node_groups"] == ids for j in fake_lepton.jobs.values())
    srv.delete(handle)


@pytest.mark.parametrize(
    "fake_lepton",
    [{"node_groups": GROUPS, "group_shapes": {"ng-a1b2c3": ("cpu.small",), "ng-d4e5f6": ("cpu.small",)}}],
    indirect=True,
)
def test_a_shape_no_pinned_group_has_is_refused_with_what_they_have(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(node_groups=["h100-pool"], resource_shape="gpu.h100-sxm")
    with pytest.raises(
        ConfigError, match=r"backend.resource_shape: .* no resource shape 'gpu.h100-sxm'.*it has: cpu.small"
    ):
        _up(cfg)
    _nothing_created(fake_lepton)
