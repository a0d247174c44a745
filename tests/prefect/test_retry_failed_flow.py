"""A run that ended Failed on failed rows is fixed from Prefect: ``batch_inference`` with
``retry_failed=True`` brings the (stopped) swarm up again, sends only the failed rows, commits again
and ends Completed; a row failing again keeps its earlier reason.

The stub fails rows (``error_rate``) only while a marker file exists (``fail_while``): the retry's
swarm, brought up with the same config (the same engine fingerprint), answers them once it is gone."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import job_options, run_logs, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import batch_inference, swarm_down
from prefect_swarm.jobs.checkpoint.ledger import EARLIER_ERRORS
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import engine_command

pytestmark = [pytest.mark.prefect_server]

N, NULLS = 120, (0, 60)
"""Rows, and the rows whose prompt is null: refused by the job on every run (no request is sent)."""


def _stub_requests(name: str) -> int:
    swarm = Swarm.from_state(name, StateStore())
    return sum(int(httpx.get(f"{u.removesuffix('/v1')}/stats", timeout=5).json()["requests"]) for u in swarm.endpoints)


def test_a_failed_rows_run_is_fixed_from_prefect(prefect_api: PrefectStack, tmp_path: Path) -> None:
    inp, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    prompts = [None if i in NULLS else f"say hello {i}" for i in range(N)]
    pq.write_table(pa.table({"id": [f"r{i:05d}" for i in range(N)], "prompt": prompts}), inp)
    marker = tmp_path / "failing"
    marker.touch()
    cfg = stub_swarm("retry-flow", latency_ms=1)
    cfg["engine"]["command"] = engine_command(latency_ms=1, error_rate=0.3, fail_while=str(marker))
    opts = job_options(max_retries=0, concurrency=8)

    first = batch_inference(cfg, opts, str(inp), str(out), shards=1, max_failed_fraction=0.05, return_state=True)
    assert first.is_failed() and "more than max_failed_fraction 0.05" in (first.message or ""), first.message
    assert "retry_failed=True" in (first.message or "")
    assert StateStore().require_swarm("retry-flow").phase == "STOPPED"  # released with the run: gone
    rec = next(j for j in StateStore().list_jobs(swarm="retry-flow"))
    lines = [json.loads(x) for x in (Path(rec.job_dir or "") / "failed.jsonl").read_text().splitlines()]
    reasons = {r["id"]: r["error"] for r in lines}
    sent_again = [i for i in reasons if int(i[1:]) not in NULLS]
    assert len(sent_again) > 6 and all("HTTP 50" in reasons[i] for i in sent_again), lines[:3]

    # the same run again: nothing is sent and it fails again (what a plain retry/rerun does)
    rerun = batch_inference(cfg, opts, str(inp), str(out), shards=1, max_failed_fraction=0.05, return_state=True)
    assert rerun.is_failed()
    assert StateStore().require_swarm("retry-flow").phase == "STOPPED"

    marker.unlink()  # the engine is healthy again
    fixed = batch_inference(
        cfg, opts, str(inp), str(out), shards=1, max_failed_fraction=0.05, retry_failed=True, keep_swarm=True
    )
    try:
        assert fixed["rows"] == N and fixed["failed"] == len(NULLS) and fixed["ok"] == N - len(NULLS), fixed
        # the stub saw the readiness probe's one chat completion and the failed rows, nothing else
        assert _stub_requests("retry-flow") == 1 + len(sent_again)
    finally:
        swarm_down("retry-flow")
    table = pq.read_table(out, columns=["id", "status", "error"]).to_pylist()
    assert [r["id"] for r in table] == [f"r{i:05d}" for i in range(N)]
    for row in table:
        if int(row["id"][1:]) in NULLS:  # failed again: the earlier reason is kept after the new one
            assert row["status"] == "error" and row["error"].endswith(EARLIER_ERRORS + reasons[row["id"]]), row
        else:
            assert row["status"] == "ok" and row["error"] is None, row
    # the answered rows' earlier reasons stay visible: counted by reason in the run's summary
    assert fixed["recovered"] == len(sent_again), fixed
    line = next(x for x in run_logs(fixed["flow_run"]) if "rows answered on a retry" in x)
    assert f": {len(sent_again)} rows answered on a retry after failing before (earlier reasons: " in line, line
    assert "HTTP 50" in line, line


def test_retry_failed_is_in_the_run_form_with_its_description() -> None:
    from prefect.utilities.callables import parameter_schema

    field = parameter_schema(batch_inference).model_dump()["properties"]["retry_failed"]
    assert field["type"] == "boolean" and field["default"] is False
    assert "only the rows" in field["description"] and "brought up" in field["description"], field
