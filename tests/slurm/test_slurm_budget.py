"""A budget lives as long as the swarm (Slurm): the LB job holds ``backend.cost.max_gpu_hours`` to the
swarm's sacct GPU-hours, so a swarm kept up with no job stops itself at its cap, replicas and LB, with
the reason in `status`, like the idle timeout."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from _slurmkit import stub_config

from prefect_swarm.backends.slurm import render
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm]

Run = Callable[..., subprocess.CompletedProcess[str]]

CAP_GPU_S = 20
"""1 replica x 1 GPU: 20 s of the replica task's elapsed time (sacct)."""


def test_a_swarm_kept_up_with_no_job_stops_itself_at_its_budget(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    cfg = stub_config(replicas=1, backend={"cost": {"max_gpu_hours": CAP_GPU_S / 3600}})
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    config = tmp_path / "swarm.yaml"
    config.write_text(yaml.safe_dump(cfg.redacted()))
    names = f"psw-{cfg.name}-replicas,psw-{cfg.name}-lb"
    try:
        began = time.monotonic()
        up = run_cli("up", "-c", str(config), "-o", "json", timeout=180)
        assert up.returncode == 0, up.stderr[-3000:]
        wait_until(  # the swarm stops itself at its budget
            "the swarm's jobs to leave the queue",
            lambda: _queue(names),
            until=lambda q: not q,
            timeout_s=90,
            poll_s=0.5,
        )
        # not before the cap: the replica task ran for CAP_GPU_S of elapsed time, within `up`'s time
        assert time.monotonic() - began >= CAP_GPU_S - 1
        done = run_cli("status", cfg.name, "-o", "json", "--no-history")
        status = json.loads(done.stdout)["status"]
        assert status["phase"] == "STOPPED", status
        assert "budget reached" in status["detail"] and "(max_gpu_hours)" in status["detail"], status
        record = json.loads(paths.slurm_record.read_text())
        assert record["array_tasks"] == 0 and "budget reached" in record["stopped"]["reason"], record
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)


def _queue(names: str) -> str:
    return subprocess.run(["squeue", "-h", "-n", names], capture_output=True, text=True).stdout.strip()
