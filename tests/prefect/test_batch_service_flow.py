"""The batch service with a Prefect API: each batch is a run of the `batch-inference/on-demand`
deployment, picked up by the real process worker, visible in Prefect with its history; the batch
follows the job that run records and comes back as without Prefect."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from helpers import stub_swarm
from stack import PrefectStack

from prefect_swarm.state import StateStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "batchserver"))
from service_kit import Service, chat_line, jsonl, lines_of, wait_batch, write_config

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _run_named(name: str):  # type: ignore[no-untyped-def]
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def read():  # type: ignore[no-untyped-def]
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
            deployment = await client.read_deployment(runs[0].deployment_id) if runs else None
            return runs, deployment

    return asyncio.run(read())


def test_a_batch_runs_as_a_deployment_run(prefect_stack: PrefectStack, tmp_path: Path) -> None:
    home = tmp_path / "service-home"
    home.mkdir(mode=0o700)
    models = {"stub-model": stub_swarm("svc-prefect")}
    config = write_config(home, models, prefect_deployment="batch-inference/on-demand", idle_release_s=0)
    env = {k: v for k, v in prefect_stack.env.items() if k != "PREFECT_SWARM_HOME"}
    svc = Service(home, config, env).start()
    try:
        client = svc.client(svc.key("alice"))
        ids = [f"p{i}" for i in range(10)]
        upload = client.files.create(file=jsonl(tmp_path / "in.jsonl", [chat_line(c) for c in ids]).open("rb"),
                                     purpose="batch")  # fmt: skip
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        batch = wait_batch(client, batch.id, timeout_s=420)
        assert batch.status == "completed", svc.log
        assert [x["custom_id"] for x in lines_of(client, batch.output_file_id)] == ids
        runs, deployment = _run_named(batch.id)
        assert len(runs) == 1 and deployment is not None and deployment.name == "on-demand"
        assert "batch-service" in runs[0].tags
        job = next(j for j in StateStore(home / "state.db").list_jobs() if j.flow_run_id == str(runs[0].id))
        assert job.swarm == "svc-prefect"  # the run brought the model's swarm up and ran the batch's job
    finally:
        svc.stop()
        svc.cli("down", "svc-prefect", "-y", "--force")
