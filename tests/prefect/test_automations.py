"""Automations: the zombie automation touches only this package's silent runs; the example
automation (deployments/prefect.yaml, `failed-rows-notice/on-failed-rows`) fires on failed rows."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack

from prefect_swarm.cli.automations import SCOPE_TAG
from prefect_swarm.flows import batch_inference
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]

ZOMBIE_WITHIN_S = 40  # what tests/prefect/stack.py installs


def _new_run(tag: str, state: Any) -> uuid.UUID:
    from prefect import flow, get_client

    @flow(name="zombie-probe")
    def probe() -> None:
        return None

    with get_client(sync_client=True) as client:
        return client.create_flow_run(probe, tags=[tag], state=state).id


def _heartbeat(run_id: uuid.UUID, tag: str) -> None:
    from prefect.events import emit_event

    emit_event(
        event="prefect.flow-run.heartbeat",
        resource={"prefect.resource.id": f"prefect.flow-run.{run_id}"},
        related=[{"prefect.resource.id": f"prefect.tag.{tag}", "prefect.resource.role": "tag"}],
    )


def _state(run_id: uuid.UUID) -> str:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    return state.type.value if state else "-"


def test_zombie_automation_is_scoped_to_this_package(prefect_stack: PrefectStack) -> None:
    from prefect import get_client
    from prefect.events.worker import EventsWorker
    from prefect.states import Completed, Running, Suspended

    ours = _new_run(SCOPE_TAG, Running())
    unrelated = _new_run("somebody-else", Running())
    done = _new_run(SCOPE_TAG, Completed())
    suspended = _new_run(SCOPE_TAG, Running())
    for run_id, tag in ((ours, SCOPE_TAG), (unrelated, "somebody-else"), (done, SCOPE_TAG), (suspended, SCOPE_TAG)):
        _heartbeat(run_id, tag)  # then silence
    EventsWorker.drain_all()
    with get_client(sync_client=True) as client:  # suspends after its heartbeat, as a run waiting for input does
        client.set_flow_run_state(suspended, Suspended(timeout_seconds=3600), force=True)
    t0 = time.monotonic()
    wait_until("our silent run Crashed", lambda: _state(ours) == "CRASHED", timeout_s=ZOMBIE_WITHIN_S + 60, poll_s=1)
    took = time.monotonic() - t0
    time.sleep(10)  # the automation has had its chance at the suspended run too (same heartbeat, same window)
    assert _state(unrelated) == "RUNNING", "the zombie automation touched a flow run outside prefect-swarm"
    assert _state(done) == "COMPLETED", "the zombie automation changed a Completed run"
    assert _state(suspended) == "PAUSED", "the zombie automation crashed a Suspended run"
    print(f"silent prefect-swarm run Crashed after {took:.0f} s; unrelated Running, Completed kept")


def test_example_automation_fires_on_failed_rows(prefect_stack: PrefectStack, tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    cfg = stub_swarm("notice", latency_ms=2)
    cfg["engine"]["command"] = engine_command(latency_ms=2, error_rate=0.3)
    inp = prompts(tmp_path / "in.parquet", 60)
    res = batch_inference(
        cfg, job_options(max_retries=0), str(inp), str(tmp_path / "out.parquet"), max_failed_fraction=0.9
    )
    assert res["failed"] > 0  # Completed (below the threshold), but with failed rows

    def notices() -> list[Any]:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["failed-rows-notice"])))
        return [r for r in runs if r.parameters.get("job_id") == res["job_id"]]

    wait_until(
        "notice run", lambda: any(r.state and r.state.is_completed() for r in notices()), timeout_s=120, poll_s=1
    )
    run = notices()[0]
    assert int(run.parameters["failed"]) == res["failed"] and run.parameters["swarm"] == "notice"
    assert str(run.parameters["failed_rows"]).endswith(".jsonl")
    print(f"failed-rows-notice ran for job {res['job_id']} ({res['failed']} failed rows)")
    # a rerun finds the job committed: no second job.committed event, so no second notice
    again = batch_inference(
        cfg, job_options(max_retries=0), str(inp), str(tmp_path / "out.parquet"), max_failed_fraction=0.9
    )
    assert again["job_id"] == res["job_id"]
    time.sleep(5)  # the event, had there been one, is recorded within a second or two
    assert _committed_events(prefect_stack.api_url, res["job_id"]) == 1


def _committed_events(api_url: str, job_id: str) -> int:
    import httpx

    body = {
        "filter": {
            "event": {"name": ["prefect-swarm.job.committed"]},
            "resource": {"id": [f"prefect-swarm.job.{job_id}"]},
        }
    }
    resp = httpx.post(api_url + "/events/filter", json={**body, "limit": 50}, timeout=10)
    resp.raise_for_status()
    return len(resp.json()["events"])
