"""Shared storage is checked, not assumed: a Lepton job sees only what is mounted, the worker must
see the same volume at exactly ``mount_path``, and a volume the workspace lacks is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import JobRequest
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import DEFAULT_VOLUME, FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]


def _submit_spec(compute: LeptonCompute, spec_path: Path) -> None:
    compute.submit(JobRequest(name="x", command=["python3", "-m", "prefect_swarm.jobs.run", "--spec", str(spec_path)]))


@pytest.mark.parametrize("field", ["input", "output"])
def test_input_or_output_off_the_mount_is_refused(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path, tmp_path: Path, field: str
) -> None:
    cfg = lepton_cfg()
    paths = {"input": str(shared_dir / "in.parquet"), "output": str(shared_dir / "out.parquet")}
    paths[field] = str(tmp_path / "elsewhere" / f"{field}.parquet")
    spec_path = shared_dir / "runs" / "j" / "spec.json"
    spec_path.parent.mkdir(parents=True)
    JobSpec(job_dir=str(spec_path.parent), **paths).save(spec_path)
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    with pytest.raises(ConfigError, match=f"job's {field} .*elsewhere.* is not on the storage Lepton jobs mount"):
        _submit_spec(compute, spec_path)
    assert fake_lepton.jobs == {}


@pytest.mark.parametrize("check", [{}, {"storage_check_timeout_s": None}], ids=["storage-check", "no-storage-check"])
def test_a_volume_the_workspace_lacks_is_refused(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path, check: dict[str, None]
) -> None:
    # the volume catalog is checked with or without the storage check
    cfg = lepton_cfg(
        mounts=[{"from": "no-such-volume", "path": "/prefect-swarm", "mount_path": str(shared_dir)}], **check
    )
    srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
    with pytest.raises(ConfigError, match=r"backend.mounts\[0\].from: .*no volume 'no-such-volume'"):
        srv.create_or_update(cfg)
    assert fake_lepton.deployments == {} and fake_lepton.jobs == {}


def test_the_storage_check_runs_before_the_endpoint(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
    handle = srv.create_or_update(cfg)
    job_posts = [i for i, (m, p, s) in enumerate(fake_lepton.requests) if m == "POST" and p.endswith("/jobs")]
    dep_posts = [i for i, (m, p, s) in enumerate(fake_lepton.requests) if m == "POST" and p.endswith("/deployments")]
    assert len(job_posts) == 1 and len(dep_posts) == 1 and job_posts[0] < dep_posts[0]
    fake_lepton.wait_deletes()  # deletes finish in the background, as on the platform
    assert fake_lepton.jobs == {}  # the check job is gone, and so is its nonce
    assert not any((Path(cfg.backend.shared_path) / ".storage-check").iterdir())  # type: ignore[union-attr]
    srv.create_or_update(cfg)  # an update of a live endpoint does not check again
    assert sum(1 for m, p, _s in fake_lepton.requests if m == "POST" and p.endswith("/jobs")) == 1
    srv.delete(handle)


def test_a_worker_that_sees_another_folder_is_refused_before_any_gpu(lepton_cfg: Make, tmp_path: Path) -> None:
    # The volume's /prefect-swarm is tmp/volume/prefect-swarm; this process has another folder at mount_path.
    with FakeLepton(volumes={DEFAULT_VOLUME: tmp_path / "volume"}) as fake:
        worker_view = tmp_path / "not-the-volume"
        cfg = lepton_cfg(
            workspace_url=fake.url,
            token=fake.token,
            mounts=[{"path": "/prefect-swarm", "mount_path": str(worker_view)}],
            shared_path=str(worker_view / "runs"),
        )
        srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
        with pytest.raises(ConfigError, match=r"backend.mounts: a Lepton job could not read .*storage-check"):
            srv.create_or_update(cfg)
        fake.wait_deletes()  # deletes finish in the background, as on the platform
        assert fake.deployments == {} and fake.jobs == {}
        # the same volume at exactly mount_path: the check passes and the endpoint starts
        volume_view = tmp_path / "volume" / "prefect-swarm"
        good = lepton_cfg(
            workspace_url=fake.url,
            token=fake.token,
            mounts=[{"path": "/prefect-swarm", "mount_path": str(volume_view)}],
            shared_path=str(volume_view / "runs"),
        )
        srv = LeptonServing(good, SwarmPaths.for_swarm(good.name))
        handle = srv.create_or_update(good)
        assert list(fake.deployments) == ["lep"]
        srv.delete(handle)
