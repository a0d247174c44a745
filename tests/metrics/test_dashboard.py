"""deployments/monitoring: every metric a Grafana panel queries exists in a scrape of a stub replica and a job."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from prefect_swarm.interfaces.metrics import scrape
from prefect_swarm.jobs.dispatch.metrics import ShardMetrics
from prefect_swarm.jobs.shard import ShardRun
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

MONITORING = Path(__file__).resolve().parents[2] / "deployments" / "monitoring"
METRIC = re.compile(r"\b(prefect_swarm_[a-z_]+|vllm:[a-z_:]+)")


def test_every_panel_metric_is_scraped(make_spec: Any) -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    wanted = {m for panel in dashboard["panels"] for t in panel["targets"] for m in METRIC.findall(t["expr"])}
    assert len(dashboard["panels"]) >= 10 and wanted
    with StubEngine(free_port(), latency_ms=1, error_rate=0.1) as stub:
        spec = JobSpec.load(make_spec(60, [stub.url], max_retries=1, backoff_base_s=0.01, auto_commit=False))
        metrics = ShardMetrics("dash", 0)
        url = metrics.serve("127.0.0.1")
        try:
            ShardRun(spec, 0, 1, metrics=metrics).run()
            scraped = set(scrape(url)) | set(scrape(f"{stub.url}/metrics"))
        finally:
            metrics.close()
    assert not wanted - scraped, f"panels query metrics nobody exports: {sorted(wanted - scraped)}"


def test_prometheus_example_reads_the_file_sd_lists() -> None:
    conf = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    engines = next(j for j in conf["scrape_configs"] if j["job_name"] == "prefect-swarm-engines")
    assert engines["file_sd_configs"][0]["files"][0].endswith("/swarms/*/targets.json")
