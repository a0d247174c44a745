"""Park and restore a Slurm swarm (issue 42, items 1 and 2): real single-node Slurm, stub replicas
behind the real nginx LB, the CLI run as its own process.

`park` ends the replica and LB jobs (nothing of the swarm stays in squeue) and the swarm shows
PARKED in `status` and `list`; `restore` brings it back from the kept scripts and it answers through
its LB again; a `job submit` that spans a park and a restore pauses (its shards, steps of the parked
allocation, flush and stop; the command waits for the restore, spending no resubmission) and finishes
every row exactly once, none failed. An idle swarm (``backend.idle_timeout_s``) parks itself, and
three holders that need it at once wake it with one restore.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from _slurmkit import make_job, our_jobs, output_ids, stub_config

from prefect_swarm.backends.slurm import render
from prefect_swarm.backends.slurm.serving import SlurmServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import Held, Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import StateStore, process_lease
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

Run = Callable[..., subprocess.CompletedProcess[str]]


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _up(run_cli: Run, cfg: SwarmConfig, tmp_path: Path) -> None:
    config = tmp_path / "swarm.yaml"
    config.write_text(yaml.safe_dump(cfg.redacted()))
    _json(run_cli("up", "-c", str(config), "-o", "json", timeout=180))


def _answers(cfg: SwarmConfig, paths: SwarmPaths) -> bool:
    key = SlurmServing(cfg, paths).cfg.api_key
    headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    lb = paths.lb_head.read_text().strip()
    return httpx.post(f"http://{lb}/v1/chat/completions", json=body, headers=headers, timeout=10).is_success


def _phase(run_cli: Run, name: str) -> str:
    return str(_json(run_cli("status", name, "-o", "json", "--no-history"))["status"]["phase"])


def test_park_empties_the_queue_and_restore_brings_it_back(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    cfg = stub_config(replicas=2)
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    try:
        _up(run_cli, cfg, tmp_path)
        assert our_jobs(cfg) and _answers(cfg, paths)
        parked = _json(run_cli("park", cfg.name, "-o", "json", timeout=120))
        assert parked["phase"] == "PARKED" and parked["snapshot"]["backend"] == "slurm"
        assert our_jobs(cfg) == "", "a job of the parked swarm is still in the queue"
        assert _phase(run_cli, cfg.name) == "PARKED"
        listed = {r["name"]: r for r in _json(run_cli("list", "-o", "json"))["swarms"]}
        assert listed[cfg.name]["phase"] == "PARKED", listed[cfg.name]
        assert paths.parked.exists() and paths.replicas_script.exists()  # the snapshot and the kept scripts
        _json(run_cli("restore", cfg.name, "-o", "json", timeout=180))
        assert _phase(run_cli, cfg.name) == "RUNNING"
        assert not paths.parked.exists()
        assert _answers(cfg, paths)
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)
    assert our_jobs(cfg) == ""


def test_an_idle_swarm_parks_and_three_holders_at_once_wake_it_with_one_restore(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = stub_config(replicas=1, backend={"idle_timeout_s": 10})
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    got: list[Held] = []
    errors: list[BaseException] = []

    def need(i: int) -> None:
        try:
            got.append(Holding(StateStore()).bring_up(Swarm(cfg), process_lease(owner=f"run-{i}"), wait=True))
        except BaseException as exc:
            errors.append(exc)

    try:
        _up(run_cli, cfg, tmp_path)
        wait_until("the idle swarm left the queue", lambda: our_jobs(cfg) == "", timeout_s=120)
        assert paths.parked.exists()
        status = _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]
        assert status["phase"] == "PARKED" and "idle_timeout_s" in status["detail"], status
        listed = {r["name"]: r for r in _json(run_cli("list", "-o", "json"))["swarms"]}
        assert listed[cfg.name]["phase"] == "PARKED", listed[cfg.name]  # `status` recorded what it saw
        caplog.set_level(logging.INFO, logger="prefect_swarm.swarm")
        threads = [threading.Thread(target=need, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not errors, errors
        restores = [r for r in caplog.records if r.getMessage().startswith(f"restoring swarm '{cfg.name}'")]
        assert len(restores) == 1, [r.getMessage() for r in restores]
        assert sorted(h.restored for h in got) == [False, False, True]
        store = StateStore()
        assert store.require_swarm(cfg.name).phase is ServingPhase.RUNNING
        assert sorted(x.owner for x in store.list_leases(cfg.name)) == ["keep", "run-0", "run-1", "run-2"]
        assert _answers(cfg, paths)
    finally:
        run_cli("down", cfg.name, "-y", "--force", timeout=120)
    assert our_jobs(cfg) == ""


def test_a_job_spanning_a_park_and_a_restore_finishes_exactly_once(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    cfg = stub_config(replicas=1, engine={"args": ["--latency-ms", "50"]})
    n = 3000
    try:
        _up(run_cli, cfg, tmp_path)
        spec = make_job(tmp_path, n, concurrency=4, shards=2, drain_seconds=1)
        cli = [sys.executable, "-m", "prefect_swarm.cli.main", "job", "submit", "-n", cfg.name, "--spec", str(spec)]
        proc = subprocess.Popen(
            [*cli, "--id", "spans"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
        )
        parts = tmp_path / "job" / "shards"
        wait_until("both shards checkpointed", lambda: len(list(parts.glob("*/part-*.parquet"))) >= 2, timeout_s=90)
        _json(run_cli("park", cfg.name, "-o", "json", timeout=120))
        assert our_jobs(cfg) == ""
        wait_until(
            "the job stopped resumable",
            lambda: _json(run_cli("job", "status", "spans", "--refresh", "-o", "json"))["status"] == "PREEMPTED",
            timeout_s=60,
        )
        assert proc.poll() is None, "the command gave up on the job while its swarm was parked"
        _json(run_cli("restore", cfg.name, "-o", "json", timeout=180))
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        assert f"swarm '{cfg.name}' is parked: waiting for its restore" in err, err[-3000:]
        assert "resubmitting (" not in err  # a pause, not a preemption: no attempt spent
    finally:
        if proc.poll() is None:
            proc.kill()
        run_cli("down", cfg.name, "-y", "--force", timeout=120)
    assert output_ids(tmp_path) == [f"r{i:05d}" for i in range(n)]  # exactly once, in order
    status = _json(run_cli("job", "status", "spans", "-o", "json"))
    assert status["status"] == "SUCCEEDED" and status["manifest"]["failed"] == 0, status
