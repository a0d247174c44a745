"""On Slurm: `top --once -o json` reads each replica's engine through the LB's file_sd list and the
LB's own counts from nginx's stub_status, and the swarm's cost in `status -o json` is sacct's elapsed x
allocated GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefect_swarm.backends.slurm.identity import read_key
from prefect_swarm.interfaces.metrics import authorized
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import WaitTimedOut, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_top_and_cost_on_slurm(need_slurm: None, tmp_path: Path) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    config = {
        "name": name,
        "model": "stub-model",
        "replicas": 2,
        "gpus_per_replica": 1,
        "port": free_port_block(2),
        "engine": {"kind": "command", "command": engine_command(latency_ms=5)},
        "backend": {
            "type": "slurm",
            "cpus_per_replica": 1,
            "queue_timeout_s": 60,
            "time_limit": "30:00",
            "lb_port": free_port_block(1),
            "cost": {"gpu_hour_usd": 3.0},
        },
    }
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(config))
    up = _cli("up", "-c", str(path), "--keep", "-o", "json", timeout=240)
    assert up.returncode == 0, up.stderr
    try:
        endpoint = json.loads(_cli("status", name, "-o", "json", "--no-history").stdout)["status"]["url"]
        key = read_key(SwarmPaths.for_swarm(name))  # closed by default: every route wants it, top sends it
        assert key
        for _ in range(3):  # requests through the LB, which its stub_status counts
            with urllib.request.urlopen(authorized(f"{endpoint}/v1/models", key), timeout=10) as resp:
                assert resp.status == 200
        doc = _top_until_both_replicas(name)
        assert doc["swarm"]["backend"] == "slurm" and doc["swarm"]["phase"] == "RUNNING"
        lb = doc["lb"]
        assert lb["error"] is None and lb["url"] == f"{endpoint}/nginx-status", lb
        assert lb["active"] >= 1 and lb["accepted"] >= 1 and lb["handled"] == lb["accepted"], lb
        assert lb["requests"] >= 3 + 2 and lb["requests_s"] is not None, lb  # ours, then top's two looks
        for r in doc["replicas"]:
            assert r["metrics_error"] is None and r["running"] is not None and r["kv_cache_usage"] is not None, r
        running = json.loads(_cli("status", name, "-o", "json", "--no-history").stdout)["status"]["cost"]
        assert running["source"] == "sacct" and running["gpus"] == 2, running
    finally:
        assert _cli("down", name, "-y", "--force", timeout=180).returncode == 0
    ids = _job_ids(name)
    cost = _settled_cost(name, ids)
    expected = _sacct_gpu_hours(ids)
    assert expected > 0
    assert cost["gpu_hours"] == pytest.approx(expected, abs=1e-6), (cost, ids)
    assert cost["usd"] == pytest.approx(expected * 3.0, abs=1e-4)


def _top_until_both_replicas(name: str) -> dict[str, Any]:
    def top() -> dict[str, Any]:
        res = _cli("top", name, "--once", "--interval", "0.2", "-o", "json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    return wait_until(
        "the LB reconciler to list both replicas",
        top,
        until=lambda doc: len(doc["metrics_targets"]) == 2 and len(doc["replicas"]) == 2,
        timeout_s=60,
        poll_s=1,
    )


def _job_ids(name: str) -> list[str]:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-S", "now-1hours", "--name", f"psw-{name}-replicas,psw-{name}-lb", "-o", "JobID"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({line.split("_")[0] for line in out.split()})


def _sacct_gpu_hours(ids: list[str]) -> float:
    """sacct's own figures: ElapsedRaw x the gres/gpu count of each allocation."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "ElapsedRaw,AllocTRES"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    hours = 0.0
    for line in out.splitlines():
        elapsed, tres = line.split("|")
        gpus = dict(kv.split("=", 1) for kv in tres.split(",") if "=" in kv).get("gres/gpu", "0")
        hours += int(elapsed) * int(gpus) / 3600
    return hours


def _settled_cost(name: str, ids: list[str]) -> dict[str, Any]:
    """`status -o json`'s cost once sacct has every allocation's end (elapsed stops growing)."""

    def look() -> tuple[float, dict[str, Any], float]:
        before = _sacct_gpu_hours(ids)
        cost = json.loads(_cli("status", name, "-o", "json", "--no-history").stdout)["status"]["cost"]
        return before, cost, _sacct_gpu_hours(ids)

    try:
        return wait_until("sacct's elapsed to settle", look, until=lambda s: s[0] == s[2], timeout_s=60, poll_s=1)[1]
    except WaitTimedOut:
        return look()[1]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )
