"""Park and restore a Lepton swarm on the fake workspace (issue 42, item 1): the endpoint is scaled to
zero replicas (the SDK's ``deployment.stop``) and back; the swarm shows PARKED meanwhile. A job whose
Lepton jobs span the park pauses (they see the snapshot through the shared mount) and finishes every
row once after the restore, none failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import API_KEY

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore, keep_lease
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until


def _answers(url: str) -> bool:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    except httpx.TransportError:
        return False
    return r.status_code == 200


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_park_scales_the_endpoint_to_zero_and_restore_brings_it_back(
    fake_lepton: FakeLepton, lepton_cfg: Callable[..., SwarmConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", fake_lepton.token)  # what a later command reattaches with
    cfg = lepton_cfg("lep-park")
    hold = Holding(StateStore())
    held = hold.bring_up(Swarm(cfg, store=hold.store, keep=True), keep_lease(cfg.name), wait=True)
    url = held.swarm.endpoint
    try:
        assert _answers(url)
        snap = hold.park(cfg.name, "by the test")
        w = fake_lepton.deployments[cfg.name]
        assert w.min_replicas() == 0 and not w.alive(), "the endpoint still runs a replica"
        assert snap.serving["deployment"] == cfg.name
        assert hold.store.require_swarm(cfg.name).phase is ServingPhase.PARKED
        assert hold.attach(cfg.name).status().phase is ServingPhase.PARKED
        assert not _answers(url)
        assert hold.park(cfg.name, "again") == snap  # idempotent
        got = hold.restore(cfg.name)
        assert got.ready is not None and got.ready.phase is ServingPhase.RUNNING
        assert fake_lepton.deployments[cfg.name].min_replicas() == cfg.replicas
        assert hold.attach(cfg.name).endpoint == url  # the same deployment, the same URL
        assert _answers(url)
    finally:
        hold.attach(cfg.name).down()


OUTAGE_S = 1.0
"""The job's ``outage_timeout_s``: a job that took the park for an outage would stop this soon after it."""


@pytest.mark.parametrize(
    "fake_lepton", [{"endpoint_command": engine_command(host="127.0.0.1", latency_ms=40)}], indirect=True
)
def test_a_job_spanning_a_park_and_a_restore_finishes_exactly_once(
    fake_lepton: FakeLepton,
    lepton_cfg: Callable[..., SwarmConfig],
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect_swarm.jobs.checkpoint.plan import job_progress
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import submit_job, wait_job

    monkeypatch.setenv("PREFECT_SWARM_HOME", str(shared_dir / "home"))  # the swarm's folder on the shared mount
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", fake_lepton.token)
    cfg = lepton_cfg("lep-park-job", token=None)
    hold = Holding(StateStore())
    hold.bring_up(Swarm(cfg, store=hold.store, keep=True), keep_lease(cfg.name), wait=True)
    n = 600
    pq.write_table(
        pa.table({"id": [f"r{i:04d}" for i in range(n)], "prompt": [f"question {i}" for i in range(n)]}),
        shared_dir / "in.parquet",
    )
    asked = JobSpec(
        input=str(shared_dir / "in.parquet"),
        output=str(shared_dir / "out.parquet"),
        id_column="id",
        shards=2,
        concurrency=2,  # 2 shards x 2 / 40 ms: ~6 s of rows
        checkpoint_every=10,
        outage_timeout_s=OUTAGE_S,
    )
    try:
        rec = submit_job(hold.attach(cfg.name), asked, detach=True)
        spec = JobSpec.model_validate(rec.spec)
        assert spec.parked_file and Path(spec.parked_file).is_relative_to(shared_dir)  # what the jobs read
        jobs = rec.handle["submissions"][0]["meta"]["jobs"]
        wait_until("rows answered", lambda: int(job_progress(spec)["done"]), until=lambda d: d >= 60, timeout_s=120)
        hold.park(cfg.name, "by the test")
        parked_at = time.monotonic()
        assert not fake_lepton.deployments[cfg.name].alive()
        # an outage would stop the shards (exit 75) past outage_timeout_s; parked, they wait
        wait_until(
            f"the swarm parked for {3 * OUTAGE_S:g} s",
            lambda: time.monotonic() - parked_at > 3 * OUTAGE_S,
            timeout_s=30,
            poll_s=0.2,
        )
        assert all(fake_lepton.jobs[j].alive() for j in jobs), "a shard's process ended while the swarm was parked"
        paused_at = int(job_progress(spec)["done"])
        assert paused_at < n
        hold.restore(cfg.name)
        doc = wait_job(rec.id, timeout_s=180)
    finally:
        hold.attach(cfg.name).down()
    assert doc["status"] == "SUCCEEDED" and doc["committed"], doc
    assert doc["manifest"]["failed"] == 0 and doc["manifest"]["rows"] == n, doc["manifest"]
    assert len(hold.store.require_job(rec.id).handle["submissions"]) == 1  # paused, never resubmitted
    out = pq.read_table(shared_dir / "out.parquet")
    assert out.column("id").to_pylist() == [f"r{i:04d}" for i in range(n)]  # every row once, in order
    assert set(out.column("status").to_pylist()) == {"ok"}
