"""``examples/lepton.yaml`` as shipped gets through its first ``up`` on the fake workspace: validate,
up, a 2-shard job and down, through the command line, with the job image (the endpoint's
``vllm/vllm-openai``) lacking prefect-swarm until ``up`` stages it.

Only what points at the real world is moved: the workspace URL (the SDK's ``LEPTON_WORKSPACE_URL``)
and the mount path ``/mnt/shared`` (a folder of this test: this machine has no such volume). The
workspace's secrets the example names are made first, as its user makes them."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefect_swarm.testing.fake_lepton import WITHOUT_PREFECT_SWARM, FakeLepton

pytestmark = [pytest.mark.lepton, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "examples" / "lepton.yaml"
KEY = "endpoint-token-of-the-example-5e1d"
ROWS = 40
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def workspace(need_lepton_sdk: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLepton]:
    for key in ("LEPTON_WORKSPACE_ID", "LEPTON_WORKSPACE_TOKEN", "LEPTON_WORKSPACE_URL"):
        monkeypatch.delenv(key, raising=False)
    with FakeLepton(workspace_id="my-workspace", images={"vllm/vllm-openai:latest": WITHOUT_PREFECT_SWARM}) as fake:
        yield fake
    assert fake.running_processes() == []


def test_the_shipped_example_validates_comes_up_runs_a_two_shard_job_and_goes_down(
    workspace: FakeLepton, run_cli: Cli, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    config = tmp_path / "lepton.yaml"
    config.write_text(EXAMPLE.read_text().replace("/mnt/shared", str(shared)))
    workspace.secrets.update({"swarm-endpoint-token": KEY, "hf-token": "hf_example"})  # `lep secret create`
    env = {
        "LEPTON_WORKSPACE_TOKEN": workspace.token,
        "LEPTON_WORKSPACE_URL": workspace.url,
        "PREFECT_SWARM_API_KEY": KEY,
        "PREFECT_SWARM_HOME": str(shared / "runs"),  # as the example says: where jobs see it
    }

    def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, env=env, timeout=timeout)
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done

    cli("validate", "-c", str(config))
    cli("up", "-c", str(config))
    assert list(workspace.deployments) == ["llama-8b"]
    staged = list((shared / "runs" / ".wheels").glob("*/*.whl"))
    assert len(staged) == 1
    pq.write_table(
        pa.table({"id": [f"r{i:03d}" for i in range(ROWS)], "prompt": [f"q {i}" for i in range(ROWS)]}),
        shared / "in.parquet",
    )
    out = shared / "out.parquet"
    cli(
        "job",
        "submit",
        "-n",
        "llama-8b",
        "--input",
        str(shared / "in.parquet"),
        "--output",
        str(out),
        "--shards",
        "2",
        "--id-column",
        "id",
    )
    table = pq.read_table(out)
    assert sorted(table.column("id").to_pylist()) == [f"r{i:03d}" for i in range(ROWS)]
    assert set(table.column("status").to_pylist()) == {"ok"}
    shards = [
        j for j in workspace.jobs.values() if j.body["metadata"]["labels"].get("prefect-swarm-job") != "storage-check"
    ]
    assert len(shards) == 2
    for job in shards:  # each shard installed the staged wheel in its own (fresh) container first
        assert str(staged[0]) in job.body["spec"]["container"]["command"][2]
        assert "/containers/" in job.extra["env"]["PATH"]
    cli("down", "llama-8b", "--yes")
    assert workspace.deployments == {} and "swarm-endpoint-token" in workspace.secrets
