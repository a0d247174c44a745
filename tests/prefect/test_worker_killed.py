"""Killing only the worker (kill -9) does not end the flow run it started: the run completes and commits.

The pool's template (``deployments/process-pool.json``) keeps flow-run output off the worker's pipe
(``stream_output: false``); with Prefect's default a flow run dies at its next log line after its
worker is gone (BrokenPipe), with every row answered and nothing committed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack, job_variables

from prefect_swarm.state import StateStore
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def test_a_run_survives_its_worker_killed(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment

    rows = 400
    inp = prompts(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"
    run = run_deployment(
        "batch-inference/on-demand",
        parameters={
            "swarm": stub_swarm("orphan", latency_ms=40),
            "job": job_options(concurrency=4),
            "input": str(inp),
            "output": str(out),
            "shards": 2,
        },
        job_variables=job_variables(swarm_home),
        flow_run_name="worker-killed",
        timeout=0,
    )
    store = StateStore(swarm_home / "state.db")

    def answering() -> bool:
        return any(j.status == "RUNNING" for j in store.list_jobs("orphan"))

    worker = prefect_stack.procs["worker"]
    try:
        wait_until("the run's job RUNNING", answering, timeout_s=180, poll_s=0.5)
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone, not its process group
        worker.wait(10)

        def final() -> bool:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run.id).state  # type: ignore[union-attr]
            return state is not None and state.is_final()

        wait_until("the run to end", final, timeout_s=240, poll_s=1)
    finally:
        if worker.poll() is not None:
            prefect_stack.start_worker()  # the tests after this one need a worker
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state  # type: ignore[union-attr]
    assert state is not None and state.is_completed(), state
    table = pq.read_table(out)
    assert table.num_rows == rows and sorted(table.column("id").to_pylist()) == [f"r{i:05d}" for i in range(rows)]
    wait_until("the swarm released", lambda: store.require_swarm("orphan").phase == "STOPPED", timeout_s=60)
