"""The job process's /metrics: served while it runs, URL in the progress file, counters that match the output."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from prefect_swarm.interfaces.metrics import Samples, scrape, total
from prefect_swarm.jobs.dispatch.metrics import ShardMetrics, metrics_address
from prefect_swarm.jobs.shard import ShardRun
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine
from prefect_swarm.testing.waiting import wait_until


def test_counters_match_the_output(make_spec: Any) -> None:
    """Scraped during and after a run with failures: ok + failed == rows, and each figure matches the output."""
    n = 300
    with StubEngine(free_port(), latency_ms=2, error_rate=0.2, seed=3) as stub:
        spec = JobSpec.load(make_spec(n, [stub.url], max_retries=0, auto_commit=True))
        metrics = ShardMetrics("j1", 0)
        url = metrics.serve("127.0.0.1")
        during: list[Samples] = []
        stop = threading.Event()

        def scrape_while_running() -> None:
            while not stop.is_set():
                during.append(scrape(url))
                time.sleep(0.05)  # the point: scrapes all through the run

        scraper = threading.Thread(target=scrape_while_running)
        scraper.start()
        try:
            assert ShardRun(spec, 0, 1, metrics=metrics).run() == 0
        finally:
            stop.set()
            scraper.join()
        final = scrape(url)
        metrics.close()
        stub_stats = stub.stats()
    out = pq.read_table(spec.output).to_pylist()
    ok = sum(r["status"] == "ok" for r in out) if "status" in out[0] else None
    manifest = json.loads(spec.paths.manifest.read_text())
    rows_ok = total(final, "prefect_swarm_rows_total", status="ok")
    rows_failed = total(final, "prefect_swarm_rows_total", status="failed")
    assert rows_ok is not None and rows_failed is not None
    assert rows_ok + rows_failed == n == len(out)
    assert (rows_ok, rows_failed) == (manifest["ok"], manifest["failed"]), manifest
    if ok is not None:
        assert rows_ok == ok
    assert rows_failed >= 1 + 20  # the null row (refused) and some injected 5xx
    assert total(final, "prefect_swarm_errors_total", kind="refused") == 1
    assert total(final, "prefect_swarm_errors_total", kind="http") == stub_stats["5xx"]
    assert total(final, "prefect_swarm_requests_total", endpoint=stub.url) == stub_stats["requests"] == n - 1
    assert total(final, "prefect_swarm_completion_tokens_total") == manifest["completion_tokens"]
    assert total(final, "prefect_swarm_request_latency_seconds_count") == n - 1
    assert total(final, "prefect_swarm_requests_in_flight") == 0
    assert total(final, "prefect_swarm_shard_rows", kind="done") == n
    assert during and any(0 < (total(s, "prefect_swarm_rows_total") or 0) < n for s in during), "no mid-run scrape"


def test_job_process_publishes_its_metrics_url(make_spec: Any) -> None:
    """``python -m prefect_swarm.jobs.run`` serves /metrics while it runs and names it in progress.json."""
    with StubEngine(free_port(), latency_ms=20) as stub:
        spec_path = make_spec(400, [stub.url], concurrency=2, checkpoint_every=10, checkpoint_seconds=0.2)
        progress = JobSpec.load(spec_path).paths.shard(0).progress
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefect_swarm.jobs.run",
                "--spec",
                str(spec_path),
                "--shard-id",
                "0",
                "--nshards",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            samples = _scrape_when_running(progress, proc)
            # metrics_host 'auto' with a loopback endpoint (a local swarm): /metrics on loopback only
            assert json.loads(progress.read_text())["metrics_url"].startswith("http://127.0.0.1:")
            assert (total(samples, "prefect_swarm_rows_total") or 0) > 0
            assert total(samples, "prefect_swarm_requests_in_flight") is not None
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, 75), err


def test_metrics_host_picks_the_address_or_turns_metrics_off(make_spec: Any) -> None:
    assert metrics_address("auto", ["http://127.0.0.1:8000", "http://localhost:8001"]) == "127.0.0.1"
    assert metrics_address("auto", ["http://127.0.0.1:8000", "http://node7:8000"]) == "0.0.0.0"
    assert metrics_address("10.1.2.3", ["http://127.0.0.1:8000"]) == "10.1.2.3"
    assert metrics_address(None, ["http://node7:8000"]) is None
    with StubEngine(free_port(), latency_ms=0) as stub:
        spec = JobSpec.load(make_spec(40, [stub.url], metrics_host=None))
        assert ShardRun(spec, 0, 1).run() == 0
    progress = json.loads(spec.paths.shard(0).progress.read_text())
    assert progress["done"] == 40 and "metrics_url" not in progress, progress


def _scrape_when_running(progress: Path, proc: subprocess.Popen[str]) -> Samples:
    def running() -> dict[str, Any]:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the job exited {proc.poll()} before {progress} had a metrics_url: {err[-2000:]}")
        return dict(json.loads(progress.read_text()))

    doc = wait_until(
        f"a metrics_url and a row done in {progress}",
        running,
        until=lambda doc: doc.get("metrics_url") and doc.get("done", 0) > 0,
        timeout_s=30,
        poll_s=0.05,
    )
    return scrape(doc["metrics_url"])
