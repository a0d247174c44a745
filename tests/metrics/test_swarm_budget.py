"""A budget lives as long as the swarm: a local swarm kept up with no job stops itself at its cap.

Its watchdogs hold ``backend.cost.max_gpu_hours`` (the backend's own GPU-hours figure), stop every
replica past the cap and record why, so `status` says STOPPED naming the cap, and a later
`job submit` on the spent swarm sends nothing. The Slurm counterpart (the LB job holds the cap) is
tests/slurm/test_slurm_budget.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prefect_swarm.config.cost import CostConfig, held_gpu_hours
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

Run = Callable[..., subprocess.CompletedProcess[str]]

CAP_GPU_S = 24
"""2 GPUs x 12 s of wall time: longer than a loaded `up`, short enough for a fast test."""


def test_a_swarm_kept_up_with_no_job_stops_itself_at_its_budget(tmp_path: Path, run_cli: Run) -> None:
    data = stub_swarm_config("kept", replicas=2, backend={"cost": {"max_gpu_hours": CAP_GPU_S / 3600}})
    data["gpus_per_replica"] = 1
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    began = time.time()
    try:
        up = run_cli("up", "-c", str(path), "--keep", "-o", "json", timeout=180)
        assert up.returncode == 0, up.stderr
        pids = [int(r["external_id"]) for r in json.loads(up.stdout)["status"]["replicas"] if r.get("external_id")]
        paths = SwarmPaths.for_swarm("kept")
        dogs = [json.loads(paths.watchdog_pid(i).read_text())["pid"] for i in range(2)]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids + dogs)

        status = _wait_stopped(run_cli, "kept", timeout_s=60)
        stopped_after = time.time() - began
        assert status["phase"] == "STOPPED", status
        assert "budget reached" in status["detail"] and "(max_gpu_hours)" in status["detail"], status
        # not before the cap: the watchdogs started after `began`, 2 GPUs count CAP_GPU_S / 2 seconds
        assert stopped_after >= CAP_GPU_S / 2 - 1, stopped_after
        assert not _alive(pids + dogs), "a replica or watchdog outlived the budget stop"
        logs = "".join(paths.watchdog_log(i).read_text() for i in range(2))
        assert "budget reached" in logs, logs[-2000:]  # (the 80 % warning is BudgetGuard's: test_budget.py)

        # the spent swarm takes no job: refused before anything is submitted, naming the cap
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", "y"]}), src)
        out = tmp_path / "out.parquet"
        sub = run_cli(
            "job", "submit", "-n", "kept", "--input", str(src), "--output", str(out), "--id-column", "id", timeout=180
        )
        assert sub.returncode == 1, sub.stdout + sub.stderr
        assert "budget reached" in sub.stderr and "Nothing was submitted" in sub.stderr, sub.stderr
        assert not out.exists()

        # brought up again, the swarm runs (the stop is over; its budget is counted afresh)
        again = run_cli("up", "-c", str(path), "--keep", "-o", "json", timeout=180)
        assert again.returncode == 0, again.stderr
        assert (
            json.loads(run_cli("status", "kept", "-o", "json", "--no-history").stdout)["status"]["phase"] == "RUNNING"
        )
        assert not paths.stopped.exists()
    finally:
        run_cli("down", "kept", "-y", "--force", timeout=180)


def test_the_swarm_figure_is_the_backends_own() -> None:
    """One formula: wall time x GPUs of each live replica (unknown starts count nothing)."""
    assert held_gpu_hours([100.0, 1900.0, None], 2, now=3700.0) == (3600 + 1800) * 2 / 3600
    assert "(max_gpu_hours)" in str(CostConfig(max_gpu_hours=1).budget(2.0))


def _wait_stopped(run_cli: Run, name: str, timeout_s: float) -> dict:
    return wait_until(
        f"swarm {name} STOPPED",
        lambda: json.loads(run_cli("status", name, "-o", "json", "--no-history").stdout)["status"],
        until=lambda status: status["phase"] == "STOPPED",
        timeout_s=timeout_s,
        poll_s=1,
    )


def _alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.Error:
            pass
    return found


def test_a_cap_must_be_positive() -> None:
    """A zero or negative cap would stop the swarm at once: refused by validation, naming the field."""
    from pydantic import ValidationError

    for cap in ({"max_gpu_hours": 0}, {"max_cost_usd": 0, "gpu_hour_usd": 2}, {"max_gpu_hours": -1}):
        with pytest.raises(ValidationError, match=next(iter(cap))):
            CostConfig.model_validate(cap)
