"""Progress is not a checkpoint: with checkpoints a minute apart, the job's progress artifact (read back
from the server while the run goes) moves at least every 5 s during the shards, `job status` moves
with it, and the run logs a line per job at a steady pace (rows, rate, time left, $ so far)."""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import job_options, prompts, run_logs, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import batch_inference
from prefect_swarm.launch import job_status
from prefect_swarm.state import StateStore
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server]

N = 240
"""2 shards x 120 rows, one request in flight each, 120 ms a request: about 15 s of shards."""


def _job_artifact(run_id: str) -> Any:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
        )
    return next((a for a in arts if " shard " not in (a.description or "")), None)


def test_progress_moves_every_few_seconds_between_checkpoints(
    prefect_api: PrefectStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_SWARM_PROGRESS_LOG_EVERY_S", "3")
    inp = prompts(tmp_path / "in.parquet", N)
    opts = job_options(concurrency=1, checkpoint_every=10_000, checkpoint_seconds=60.0)
    cfg = stub_swarm("pace", latency_ms=120)
    result: dict[str, Any] = {}

    def run() -> None:
        out = str(tmp_path / "out.parquet")
        result["state"] = batch_inference(cfg, opts, str(inp), out, shards=2, return_state=True)

    # the run in a thread of this test, in its context (the Prefect settings: the test's server)
    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True)
    thread.start()
    wait_until("the job's record", lambda: any(j.flow_run_id for j in StateStore().list_jobs("pace")), timeout_s=120)
    (job,) = StateStore().list_jobs("pace")
    run_id = str(job.flow_run_id)
    history: list[tuple[float, float]] = []  # (when seen, percent) each time the artifact changed
    statuses: set[int] = set()
    while thread.is_alive():
        art = _job_artifact(run_id)
        if art is not None and (not history or history[-1][1] != float(art.data)):
            history.append((time.monotonic(), float(art.data)))
        if 0 < (done := int(job_status(job.id, refresh=False)["progress"]["done"])) < N:
            statuses.add(done)
        time.sleep(0.25)  # the point: the pace of the artifact's changes over the run is what is measured
    thread.join()
    assert result["state"].is_completed(), result["state"]
    during = [t for t, percent in history if 0 < percent < 100]
    assert len(during) >= 3, history
    during.append(next(t for t, percent in history if percent == 100))  # the last step counts too
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps) <= 5.0, (gaps, history)
    assert len(statuses) >= 3, statuses  # `job status` moved too, not only at the end
    lines = [x for x in run_logs(run_id) if x.startswith(f"Job {job.id}: ") and " rows/s, " in x]
    assert len(lines) >= 2 and all("failed)" in x and ("left" in x or "every row answered" in x) for x in lines), lines
    print(f"artifact changes during shards: {len(during)}, largest gap {max(gaps):.1f} s; {len(lines)} log lines")
