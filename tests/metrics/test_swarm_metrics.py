"""The swarm side: each replica's engine /metrics through the file_sd list, and `top --once -o json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prefect_swarm.cli.top import parse_stub_status
from prefect_swarm.interfaces.metrics import read_file_sd, scrape, total
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until


@pytest.fixture
def local_swarm(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running local swarm of two stub engines (20 ms latency), down at the end."""
    data = stub_swarm_config("metered", replicas=2, latency_ms=20)
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    up = _cli("up", "-c", str(path), "--keep", "-o", "json")
    assert up.returncode == 0, up.stderr
    try:
        yield "metered", path
    finally:
        _cli("down", "metered", "-y", "--force")


def test_every_replica_is_a_metrics_target(local_swarm: tuple[str, Path]) -> None:
    """The backend's file_sd list names each replica; each answers vLLM-shaped metrics."""
    name, _ = local_swarm
    swarm = Swarm.from_state(name)
    assert swarm.handle is not None
    targets = swarm.backends.serving.metrics_targets(swarm.handle)
    assert targets.reason is None
    assert [t.labels["replica"] for t in targets.targets] == ["0", "1"]
    assert read_file_sd(SwarmPaths.for_swarm(name).metrics_targets) == targets
    for t in targets.targets:
        samples = scrape(t.url)
        for series in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            assert total(samples, series) is not None, (t.url, series)
        assert (total(samples, "vllm:generation_tokens_total") or 0) >= 1  # the readiness chat
    swarm.backends.serving.delete(swarm.handle)
    assert swarm.backends.serving.metrics_targets(swarm.handle).reason


def test_nginx_stub_status_page_parses() -> None:
    page = "Active connections: 3 \nserver accepts handled requests\n 17 16 40 \nReading: 0 Writing: 1 Waiting: 2 \n"
    assert parse_stub_status(page) == {
        "active": 3, "accepted": 17, "handled": 16, "requests": 40, "reading": 0, "writing": 1, "waiting": 2,
    }  # fmt: skip
    with pytest.raises(ValueError, match="not an nginx stub_status page"):
        parse_stub_status("<html>404</html>")


def test_top_once_json_on_a_running_local_swarm(local_swarm: tuple[str, Path], tmp_path: Path) -> None:
    """While a job runs: each replica healthy with its figures, the job with rows, rate and ETA."""
    name, _ = local_swarm
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": [f"question {i}" for i in range(3000)]}), src)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"checkpoint_every": 100, "checkpoint_seconds": 0.5}))
    sub = _cli(
        "job", "submit", "-n", name, "--input", str(src), "--output", str(tmp_path / "out.parquet"),
        "--concurrency", "4", "--spec", str(spec), "--detach",
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    try:
        doc = _top_with_rows(name)
        assert doc["swarm"]["phase"] == "RUNNING"
        assert doc["lb"]["active"] is None and doc["lb"]["error"] == "no nginx load balancer on the local backend"
        assert [r["health"] for r in doc["replicas"]] == ["Healthy", "Healthy"]
        for r in doc["replicas"]:
            assert r["metrics_error"] is None, r
            assert r["running"] is not None and r["waiting"] == 0 and r["kv_cache_usage"] is not None
            assert r["tok_s"] is not None and r["tok_s"] > 0, doc
        (job,) = doc["jobs"]
        assert job["id"] == job_id and job["total"] == 3000 and 0 < job["done"] < 3000
        assert job["rate_rows_s"] > 0 and job["eta_s"] is not None and job["in_flight"] is not None
        assert job["eta_s"] == round(job["projection"]["remaining_s"])  # the one projection rule
        live = subprocess.run(
            [sys.executable, "-m", "prefect_swarm.cli.main", "top", name, "--interval", "0.2"],
            input="q",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert live.returncode == 0 and "replica" in live.stdout, live.stderr  # q quits the live view
    finally:
        _cli("job", "cancel", job_id)


def _top_with_rows(name: str) -> dict[str, Any]:
    def top() -> dict[str, Any]:
        res = _cli("top", name, "--once", "--interval", "0.5", "-o", "json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    return wait_until(
        "top to show the job running with rows done",
        top,
        until=lambda doc: doc["jobs"] and doc["jobs"][0]["done"] and doc["jobs"][0]["shards_running"],
        timeout_s=60,
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
