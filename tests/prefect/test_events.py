"""The package's own events are readable through the API after a run (what automations trigger on)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import batch_inference
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server]


def _events(api_url: str, since: datetime) -> list[dict[str, Any]]:
    body = {"filter": {"event": {"prefix": ["prefect-swarm."]}, "occurred": {"since": since.isoformat()}}, "limit": 50}
    resp = httpx.post(api_url + "/events/filter", json=body, timeout=10)
    resp.raise_for_status()
    return list(resp.json()["events"])


def test_run_emits_swarm_and_job_events(prefect_api: PrefectStack, tmp_path: Path) -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    inp = prompts(tmp_path / "in.parquet", 20)
    state = batch_inference(
        stub_swarm("evented"), job_options(), str(inp), str(tmp_path / "out.parquet"), shards=2, return_state=True
    )
    run_id = str(state.state_details.flow_run_id)
    wanted = {
        "prefect-swarm.swarm.up",
        "prefect-swarm.swarm.ready",
        "prefect-swarm.job.shard.completed",
        "prefect-swarm.job.committed",
        "prefect-swarm.job.succeeded",
        "prefect-swarm.swarm.down",
    }

    def of_run() -> list[dict[str, Any]]:
        ref = f"prefect.flow-run.{run_id}"
        return [
            e for e in _events(prefect_api.api_url, since) if any(r["prefect.resource.id"] == ref for r in e["related"])
        ]

    wait_until("events", lambda: wanted <= {e["event"] for e in of_run()}, timeout_s=30)
    events = of_run()
    shards = sorted(e["payload"]["shard"] for e in events if e["event"] == "prefect-swarm.job.shard.completed")
    assert shards == [0, 1], [(e["event"], e["payload"]) for e in events]
    committed = next(e for e in events if e["event"] == "prefect-swarm.job.committed")
    assert committed["payload"]["rows"] == 20 and committed["payload"]["failed"] == 0
    related = {r["prefect.resource.id"] for r in committed["related"]}
    assert {f"prefect.flow-run.{run_id}", "prefect-swarm.swarm.evented"} <= related
    verdict = next(e for e in events if e["event"] == "prefect-swarm.job.succeeded")
    assert verdict["payload"]["ok"] == 20 and "failed" not in {e["event"].rsplit(".", 1)[-1] for e in events}
    up = next(e for e in events if e["event"] == "prefect-swarm.swarm.up")
    assert up["resource"]["prefect.resource.id"] == "prefect-swarm.swarm.evented"
