"""Ctrl-C on a waiting `job submit`: the job runs on, the command says so and how to carry on
(exit 130), and the commands it names run. A real local swarm of slow stub engines, the CLI as its
own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hints import hint_commands, parse_command

from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.usefixtures("local_backend"), pytest.mark.slow]


def test_ctrl_c_on_job_submit_says_the_job_runs_on_and_how_to_stop_it(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path], swarm_home: Path, tmp_path: Path
) -> None:
    engine = {"kind": "command", "command": engine_command(latency_ms=200), "startup_timeout_s": 60}
    config = stub_swarm_config("intr", replicas=1, engine=engine)
    assert run_cli("up", "-c", str(config), "-o", "json", timeout=120).returncode == 0
    ids = [f"r{i}" for i in range(3000)]  # distinct prompts: identical ones would be sent once (deduplicated)
    pq.write_table(pa.table({"id": ids, "prompt": [f"q {i}" for i in range(3000)]}), tmp_path / "in.parquet")
    argv = ["job", "submit", "-n", "intr", "--input", str(tmp_path / "in.parquet")]
    argv += ["--output", str(tmp_path / "out.parquet"), "--shards", "2", "--concurrency", "2", "--id", "intr-1"]
    cli = [sys.executable, "-m", "prefect_swarm.cli.main", *argv]
    proc = subprocess.Popen(  # its own process group: Ctrl-C reaches the whole foreground group
        cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ), start_new_session=True
    )
    wait_until(  # a row done: the Ctrl-C lands on a job that is running
        "job intr-1 to have done a row",
        lambda: json.loads(run_cli("job", "status", "intr-1", "-o", "json").stdout)["progress"],
        until=lambda progress: progress.get("done", 0) > 0,
        timeout_s=60,
        poll_s=0.5,
    )
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    _out, err = proc.communicate(timeout=180)  # minutes only on a loaded machine; seconds quiet
    assert proc.returncode == 130, err[-2000:]
    assert "keeps running" in err, err[-2000:]
    hints = hint_commands(" ".join(err.split()))
    assert ["job", "wait", "intr-1"] in hints and ["job", "cancel", "intr-1"] in hints, hints
    for hint in hints:
        parse_command(hint)
    status = json.loads(run_cli("job", "status", "intr-1", "-o", "json").stdout)
    assert status["status"] == "RUNNING", status  # the shards run on
    cancelled = run_cli("job", "cancel", "intr-1", timeout=120)  # the hint runs: it stops them
    assert cancelled.returncode == 0, cancelled.stderr[-2000:]
    assert json.loads(run_cli("job", "status", "intr-1", "-o", "json").stdout)["status"] == "CANCELLED"
