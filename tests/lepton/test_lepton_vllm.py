"""The Lepton backend serving the real vLLM CPU build (through the fake, which runs the engine command)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import services

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobRequest, JobStatus, ServingPhase
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = [pytest.mark.lepton, pytest.mark.vllm, pytest.mark.slow]


def test_vllm_endpoint_and_two_shard_job(
    need_vllm: None, need_lepton_sdk: None, lepton_cfg: Callable[..., SwarmConfig], shared_dir: Path
) -> None:
    from prefect_swarm.jobs.rows.commit import commit_output
    from prefect_swarm.jobs.spec import JobSpec

    with FakeLepton(run_endpoint_commands=True) as fake:
        base = lepton_cfg(name="lep-vllm")
        cfg = SwarmConfig.model_validate(
            {
                **base.model_dump(by_alias=True, exclude={"api_key", "backend"}),
                "api_key": base.api_key.get_secret_value(),  # type: ignore[union-attr]
                "backend": {
                    **base.backend.model_dump(by_alias=True, exclude={"token", "workspace_url"}),
                    "workspace_url": fake.url,
                    "token": fake.token,
                    "ready_poll_s": 1.0,
                },
                "model": str(services.tiny_model()),
                "served_model_name": "tiny",
                "ready_timeout_s": 300,
                "engine": {
                    "kind": "vllm",
                    "python": str(services.vllm_python()),
                    "args": services.VLLM_ARGS,
                    "env": services.VLLM_ENV,
                },
            }
        )
        with Swarm(cfg) as swarm:
            assert swarm.status().phase is ServingPhase.RUNNING
            pq.write_table(
                pa.table({"id": [f"r{i}" for i in range(8)], "prompt": [f"say {i}" for i in range(8)]}),
                shared_dir / "in.parquet",
            )
            spec = JobSpec(
                job_id="job-vllm",
                input=str(shared_dir / "in.parquet"),
                output=str(shared_dir / "out.parquet"),
                job_dir=str(shared_dir / "runs" / "job-vllm"),
                id_column="id",
                shards=2,
                concurrency=4,
                model="tiny",
                endpoints=swarm.endpoints,
                swarm_fingerprint=swarm.fingerprint,
                job_kwargs={"sampling": {"max_tokens": 4}},
            )
            spec_path = spec.save()
            compute = swarm.compute
            job = compute.submit(
                JobRequest(
                    name="job-vllm",
                    nshards=2,
                    command=compute.job_runtime().module_argv("prefect_swarm.jobs.run", "--spec", str(spec_path)),
                )
            )
            assert compute.wait(job, poll_s=0.5) is JobStatus.SUCCEEDED, compute.logs(job)
            manifest = commit_output(spec)
            out = pq.read_table(shared_dir / "out.parquet")
            assert out.column("id").to_pylist() == [f"r{i}" for i in range(8)]
            assert set(out.column("status").to_pylist()) == {"ok"}, manifest
        assert fake.running_processes() == []
