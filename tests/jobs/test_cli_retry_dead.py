"""`job retry` on a swarm whose record still says RUNNING but whose processes are gone: it says so
before sending anything (exit 4, offering --up), at once rather than waiting out an outage;
`--up` brings it back and the retry runs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
from _jobkit import make_dataset
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config

NAME = "retry-dead"


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _kill_swarm_processes(swarm: Swarm) -> list[int]:
    """SIGKILL the swarm's watchdogs and what they started (the engines), by PID; return the PIDs."""
    assert swarm.handle is not None
    dogs = [psutil.Process(int(w["pid"])) for w in swarm.handle.meta["watchdogs"]]
    procs = [*dogs, *(c for d in dogs for c in d.children(recursive=True))]
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)
    return [p.pid for p in procs]


def test_retry_on_a_swarm_recorded_running_whose_processes_are_gone(tmp_path: Path) -> None:
    make_dataset(tmp_path / "in.parquet", 30)
    swarm = Swarm(SwarmConfig.model_validate(stub_swarm_config(NAME)))
    swarm.up()
    swarm.wait_ready()
    try:
        res = _cli(
            "job", "submit", "-n", NAME, "--input", str(tmp_path / "in.parquet"), "--output",
            str(tmp_path / "out.parquet"), "--id-column", "id", "--id", "jdead",
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        killed = _kill_swarm_processes(swarm)
        assert len(killed) >= 2 and not any(psutil.pid_exists(p) and psutil.Process(p).is_running() for p in killed)
        assert StateStore().require_swarm(NAME).phase == "RUNNING"  # the record does not know yet
        subs = StateStore().require_job("jdead").handle

        t0 = time.monotonic()
        res = _cli("job", "retry", "jdead")
        took = time.monotonic() - t0
        text = " ".join(res.output.split())
        assert res.exit_code == 4, res.output
        assert f"swarm '{NAME}' of job jdead is recorded RUNNING but gone (STOPPED" in text, text
        assert "no row was sent" in text and "`prefect-swarm job retry jdead --up`" in text, text
        assert took < 10, f"the refusal took {took:.1f} s"
        assert StateStore().require_job("jdead").handle == subs  # nothing was submitted

        res = _cli("job", "retry", "jdead", "--up")
        assert res.exit_code == 0, res.output
        assert "bringing it up again" in res.output and StateStore().require_swarm(NAME).phase == "RUNNING"
        assert "30 rows: 30 ok, 0 failed" in " ".join(res.output.split()), res.output
        print(f"retry on a dead swarm refused in {took:.2f} s (exit 4); --up brought it back")
    finally:
        assert _cli("down", NAME, "-y").exit_code == 0
