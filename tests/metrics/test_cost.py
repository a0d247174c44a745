"""Cost: a price per GPU-hour turns GPU-hours into USD and USD per million tokens, in `status` and `job status`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

from prefect_swarm.backends.slurm.accounting import gpus_of
from prefect_swarm.cli.views import cost_text
from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.cost import CostConfig
from prefect_swarm.testing.stub_engine import stub_swarm_config


def test_a_price_turns_gpu_hours_into_dollars() -> None:
    cost = CostConfig(gpu_hour_usd=2.0, per_shape={"gpu.h100-sxm": 3.0})
    assert cost.figures(1.5, 1_000_000) == {"gpu_hours": 1.5, "usd": 3.0, "usd_per_million_tokens": 3.0}
    assert cost.figures(1.0, 500_000, shape="gpu.h100-sxm")["usd_per_million_tokens"] == 6.0
    assert CostConfig().figures(2.0, 10) == {"gpu_hours": 2.0, "usd": None, "usd_per_million_tokens": None}
    assert cost.figures(None)["usd"] is None


def test_cost_line_of_the_text_tables() -> None:
    priced = {"gpu_hours": 0.5, "usd": 1.25, "usd_per_million_tokens": 2.5, "source": "sacct"}
    assert cost_text(priced) == "cost: 0.5 GPU-hours, $1.25 ($2.5/M tokens), from sacct"
    unpriced = {"gpu_hours": 0.5, "usd": None, "usd_per_million_tokens": None, "source": "wall"}
    assert cost_text(unpriced) == "cost: 0.5 GPU-hours (no price: set backend.cost.gpu_hour_usd), from wall"
    assert cost_text({"gpu_hours": None, "reason": "sacct: down"}) == "cost: n/a (sacct: down)"
    assert cost_text(None) is None


def test_every_backend_takes_a_cost_section() -> None:
    for backend in ({"type": "local"}, {"type": "slurm"}, {"type": "lepton", "workspace_id": "ws"}):
        cfg = SwarmConfig.model_validate(
            {"name": "priced", "model": "m", "backend": {**backend, "cost": {"gpu_hour_usd": 1.25}}}
        )
        assert cfg.backend.cost.gpu_hour_usd == 1.25
    with pytest.raises(ValidationError, match="gpu_hour_usd"):
        SwarmConfig.model_validate(
            {"name": "p", "model": "m", "backend": {"type": "local", "cost": {"gpu_hour_usd": -1}}}
        )


def test_gpus_of_alloc_tres() -> None:
    assert gpus_of("billing=1,cpu=1,gres/gpu=1,node=1") == 1
    assert gpus_of("cpu=8,gres/gpu:a100=4,gres/gpu=4,mem=64G") == 4
    assert gpus_of("billing=1,cpu=1,node=1") == 0


def test_local_status_and_job_status_report_cost(tmp_path: Path) -> None:
    """Local: wall x GPUs in use, priced; `job status` prices the job's share, per million tokens too."""
    data = stub_swarm_config("priced", replicas=2, backend={"cost": {"gpu_hour_usd": 4.0}})
    data["gpus_per_replica"] = 1
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    assert _cli("up", "-c", str(path), "--keep", "-o", "json").returncode == 0
    try:
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"prompt": [f"q {i}" for i in range(200)]}), src)
        sub = _cli("job", "submit", "-n", "priced", "--input", str(src), "--output", str(tmp_path / "o.parquet"))
        assert sub.returncode == 0, sub.stderr
        status = json.loads(_cli("status", "priced", "-o", "json", "--no-history").stdout)["status"]
        cost = status["cost"]
        assert cost["source"] == "wall" and cost["gpus"] == 2 and cost["gpu_hours"] > 0, cost
        assert cost["usd"] == pytest.approx(cost["gpu_hours"] * 4.0, abs=1e-3)
        assert cost["tokens"] > 0 and cost["usd_per_million_tokens"] > 0
        (job,) = json.loads(_cli("job", "list", "-o", "json").stdout)["jobs"]
        doc = json.loads(_cli("job", "status", job["id"], "-o", "json").stdout)
        jc = doc["cost"]
        assert jc["gpu_hours"] > 0 and jc["usd"] == pytest.approx(jc["gpu_hours"] * 4.0, abs=1e-3), jc
        tokens = doc["progress"]["prompt_tokens"] + doc["progress"]["completion_tokens"]
        assert jc["usd_per_million_tokens"] == pytest.approx(jc["usd"] / tokens * 1e6, rel=0.01)
        # the text tables carry the same figures
        text = _cli("status", "priced", "--no-history").stdout
        assert re.search(r"cost: [0-9.e-]+ GPU-hours, \$[0-9.e-]+ \(\$[0-9.e-]+/M tokens\), from wall", text), text
        job_text = _cli("job", "status", job["id"]).stdout
        assert re.search(r"cost: [0-9.e-]+ GPU-hours, \$[0-9.e-]+ .*, from wall", job_text), job_text
    finally:
        _cli("down", "priced", "-y", "--force")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
