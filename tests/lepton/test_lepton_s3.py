"""``s3://`` input and output of a job on Lepton (a real S3 API: moto with IAM on loopback): the jobs
get the store's credentials only by workspace-secret reference (``backend.job_secret_env``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import JobStatus
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton
from prefect_swarm.testing.moto_s3 import MotoS3

pytestmark = [pytest.mark.lepton, pytest.mark.slow]

Make = Callable[..., SwarmConfig]
BUCKET = "lepton-data"
ROWS = 30


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    """A moto S3 server with IAM: this process (the submitter) holds the admin's keys."""
    with MotoS3(iam=True) as server:
        server.create_bucket(BUCKET)
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        yield server


def _put_input(tmp_path: Path) -> str:
    local = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": [f"r{i:02d}" for i in range(ROWS)], "prompt": [f"q {i}" for i in range(ROWS)]}), local
    )
    fs = storage.parse(f"s3://{BUCKET}/x", "test").fs
    with open(local, "rb") as src, fs.open_output_stream(f"{BUCKET}/in/data.parquet", compression=None) as dst:
        dst.write(src.read())
    return f"s3://{BUCKET}/in/data.parquet"


def test_s3_input_and_output_with_credentials_by_secret_reference(
    lepton_cfg: Make,
    fake_lepton: FakeLepton,
    s3: MotoS3,
    tmp_path: Path,
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect_swarm.launch import submit_job

    job_user = s3.add_user("lepton-job", ["s3:*"])  # the jobs' own keys, held by the workspace
    fake_lepton.secrets.update(
        {"aws-key-id": job_user["AWS_ACCESS_KEY_ID"], "aws-secret": job_user["AWS_SECRET_ACCESS_KEY"]}
    )
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(shared_dir / "home"))
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", fake_lepton.token)
    plain = {k: v for k, v in s3.env().items() if not k.startswith(("AWS_ACCESS_KEY_ID", "AWS_SECRET"))}
    base = lepton_cfg(
        name="s3", token=None, job_secret_env={"AWS_ACCESS_KEY_ID": "aws-key-id", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    )
    cfg = base.model_copy(update={"env": plain})
    spec = JobSpec(input=_put_input(tmp_path), output=f"s3://{BUCKET}/out/answers.parquet", id_column="id", shards=2)
    with Swarm(cfg) as swarm:
        rec = submit_job(swarm, spec, detach=False)
        assert rec.status == JobStatus.SUCCEEDED.value, rec
        shard_jobs = [
            j for j in fake_lepton.jobs.values() if j.body["metadata"]["labels"]["prefect-swarm-job"] != "storage-check"
        ]
        assert len(shard_jobs) == 2
        for job in shard_jobs:
            envs = {e["name"]: e for e in job.body["spec"]["envs"]}
            assert envs["AWS_ACCESS_KEY_ID"] == {
                "name": "AWS_ACCESS_KEY_ID",
                "value_from": {"secret_name_ref": "aws-key-id"},
            }
            assert job_user["AWS_SECRET_ACCESS_KEY"] not in str(job.body["spec"])
            assert job.extra["env"]["AWS_ACCESS_KEY_ID"] == job_user["AWS_ACCESS_KEY_ID"]  # resolved in the container
    out = pq.read_table(f"{BUCKET}/out/answers.parquet", filesystem=storage.parse(f"s3://{BUCKET}/x", "t").fs)
    assert sorted(out.column("id").to_pylist()) == [f"r{i:02d}" for i in range(ROWS)]
    assert set(out.column("status").to_pylist()) == {"ok"}


def test_s3_without_credentials_for_the_jobs_is_refused_before_any_job(
    lepton_cfg: Make,
    fake_lepton: FakeLepton,
    s3: MotoS3,
    tmp_path: Path,
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect_swarm.launch import submit_job

    monkeypatch.setenv("PREFECT_SWARM_HOME", str(shared_dir / "home"))
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", fake_lepton.token)
    cfg = lepton_cfg(name="s3-bare", token=None, storage_check_timeout_s=None)
    spec = JobSpec(input=_put_input(tmp_path), output=f"s3://{BUCKET}/out/x.parquet", id_column="id", shards=1)
    with Swarm(cfg) as swarm:
        with pytest.raises(
            ConfigError, match=r"input s3://.* is on S3, but a Lepton job gets no credentials.*job_secret_env"
        ):
            submit_job(swarm, spec, detach=False)
        assert fake_lepton.jobs == {}
