"""Model staging (``stage:``) on the real single-node Slurm: two array tasks on one node stage once, a
second ``up`` skips the copy, and the engines are given the staged folder."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _slurmkit import STUB_COMMAND, LiveSwarm, stub_config

from prefect_swarm.config import SwarmConfig
from prefect_swarm.paths import file_lock
from prefect_swarm.sidecar.stage import lock_path
from prefect_swarm.testing.models import make_model_folder, model_checking_engine
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MakeSwarm = Callable[..., LiveSwarm]

CHECKING_ENGINE = model_checking_engine(STUB_COMMAND)


def squeue(cfg: SwarmConfig) -> list[str]:
    argv = ["squeue", "-h", "-n", f"psw-{cfg.name}-replicas", "-o", "%i %T"]
    return subprocess.run(argv, capture_output=True, text=True).stdout.split("\n")


def running_tasks(cfg: SwarmConfig) -> list[str]:
    return [line for line in squeue(cfg) if line.endswith(" RUNNING")]


def staged_mtimes(staged: Path) -> dict[str, int]:
    return {p.relative_to(staged).as_posix(): p.stat().st_mtime_ns for p in staged.rglob("*") if p.is_file()}


def test_two_tasks_on_one_node_stage_once_and_a_second_up_skips(
    slurm_swarm: MakeSwarm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model_folder(tmp_path, weights_mb=4, tokenizer=False)
    cfg = stub_config(
        replicas=2,  # one replica per array task: two tasks stage at once on the one node
        model=str(model),
        stage={"to": str(tmp_path / "node-disk")},
        engine={"command": CHECKING_ENGINE, "python": sys.executable},
    )
    staged = Path(cfg.staged_model or "")

    first = slurm_swarm(cfg)
    t0 = time.monotonic()
    with file_lock(lock_path(staged)):  # both tasks reach the stager while the lock is held: they contend
        first.handle = first.serving.create_or_update(cfg)
        wait_until("both tasks running", lambda: running_tasks(cfg), until=lambda t: len(t) == 2, timeout_s=60)
        time.sleep(2.0)  # each task runs its stager, which blocks on the lock
        assert not first.paths.stage_log.exists() or "staged" not in first.paths.stage_log.read_text()
    first.serving.wait_ready(first.handle, 120)
    first_s = time.monotonic() - t0
    log = first.paths.stage_log.read_text()
    assert log.count("staged 2 files") == 1 and log.count("already staged") == 1, log
    for i in range(2):
        assert f"engine model path: {staged}" in first.paths.replica_log(i).read_text()
    mtimes = staged_mtimes(staged)
    first.down()

    second = slurm_swarm(cfg)
    t0 = time.monotonic()
    second.up()
    second_s = time.monotonic() - t0
    log = second.paths.stage_log.read_text()
    assert log.count("staged 2 files") == 1 and log.count("already staged") == 3, log
    assert staged_mtimes(staged) == mtimes  # nothing copied again
    second.down()
    with capsys.disabled():  # in the test log even without -s
        print(f"\nslurm staging: first up (copy) {first_s:.2f} s, second up (skipped) {second_s:.2f} s\n{log}")
