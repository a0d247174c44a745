"""`prefect-swarm exec` on the real Slurm: the command runs as a step of the replica's array task."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _slurmkit import PY, stub_config

from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.paths import read_text
from prefect_swarm.swarm import Swarm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CHAT = (
    "import os; from prefect_swarm.interfaces.readiness import check_answer; "
    "r = check_answer(f\"http://{os.environ['SLURMD_NODENAME']}:{os.environ['PORT']}\", 'stub-model', "
    "os.environ['PREFECT_SWARM_API_KEY']); "
    "print(os.environ['SLURM_JOB_ID'], r.ok, os.environ.get('CUDA_VISIBLE_DEVICES', '-')); raise SystemExit(7)"
)


def test_exec_runs_in_the_replica_task_with_its_port_and_key(need_slurm: None, run_cli: Callable[..., Any]) -> None:
    with Swarm(stub_config(replicas=2)) as swarm:  # up + wait_ready; down on exit
        task = swarm.status().replicas[1].external_id
        assert task is not None
        raw = SlurmClient().raw_id(task)  # what SLURM_JOB_ID is inside the task's steps
        got = run_cli("exec", swarm.cfg.name, "--replica", "1", "--", PY, "-c", CHAT)
        assert got.returncode == 7, got.stderr
        # the step ran in replica 1's task, and reached its engine on $PORT with the swarm's key
        job_id, chatted, gpus = got.stdout.split()
        assert (job_id, chatted) == (raw, "True"), (got.stdout, got.stderr)
        assert gpus == _engine_env(swarm, 1).get("CUDA_VISIBLE_DEVICES", "-")  # the replica's GPUs
        assert read_text(swarm.paths.replica_head(1))  # it was healthy throughout
        assert run_cli("exec", swarm.cfg.name, "--", "false").returncode == 1


def _engine_env(swarm: Swarm, i: int) -> dict[str, str]:
    """The environment replica ``i``'s engine process runs with (its pid from the watchdog's status)."""
    pid = json.loads(swarm.paths.replica_status(i).read_text())["pid"]
    pairs = (kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}
