"""Cancel through the API and SIGKILL of the flow process: no swarm process outlives the run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import flow_process, job_options, prompts, run_logs, stub_swarm, swarm_processes, wait_for
from stack import PrefectStack, job_variables

from prefect_swarm.state import StateStore
from prefect_swarm.tasks.reaper import reap_orphans

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _start_long_run(name: str, swarm_home: Path, tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    from prefect.deployments import run_deployment

    cfg = stub_swarm(name, latency_ms=300)
    inp = prompts(tmp_path / "in.parquet", 400)
    run = run_deployment(
        "batch-inference/on-demand",
        timeout=0,
        job_variables=job_variables(swarm_home),
        parameters={
            "swarm": cfg,
            "job": job_options(concurrency=2),
            "input": str(inp),
            "output": str(tmp_path / "out.parquet"),
            "shards": 2,
        },
    )
    store = StateStore()

    def shards_running() -> bool:
        rec = store.get_swarm(name)
        return rec is not None and rec.phase == "RUNNING" and any(j.status == "RUNNING" for j in store.list_jobs(name))

    wait_for(shards_running, 120, what="swarm RUNNING with shard jobs")
    time.sleep(2)
    return run, cfg


def _state(run_id: Any) -> Any:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def test_cancel_reaches_backend_within_30s(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.states import Cancelling

    run, cfg = _start_long_run("cancelme", swarm_home, tmp_path)
    assert swarm_processes(swarm_home, "cancelme", cfg["port"])
    t0 = time.monotonic()
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)  # what the UI's Cancel button does
    gone = wait_for(
        lambda: not swarm_processes(swarm_home, "cancelme", cfg["port"]),
        30,
        what="every swarm process to exit",
    )
    store = StateStore()  # the record follows the processes (killed first, then recorded STOPPED)
    wait_for(lambda: store.require_swarm("cancelme").phase == "STOPPED", 15, what="record STOPPED")
    final = wait_for(lambda: _state(run.id).is_final(), 40, what="run final")
    assert _state(run.id).type.value == "CANCELLED"
    try:
        shards = wait_for(lambda: _shard_states(run.id) == ["CANCELLED", "CANCELLED"], 30, what="shards Cancelled")
    except AssertionError:
        raise AssertionError(f"shard task runs: {_shard_states(run.id)}") from None
    # the run's lines say what happened: no "Finished in state Running()", the last line is its real
    # state, and the teardown names what it stopped (or that the run had let go of everything itself)
    wait_for(lambda: any(x.startswith(f"Flow run {run.id} ended") for x in run_logs(run.id)), 30, what="hook line")
    logs = run_logs(run.id)
    assert "Finished in state Running()" not in logs, logs[-5:]
    assert logs[-1].startswith(f"Flow run {run.id} ended Cancelled: "), logs[-5:]
    assert "none" not in logs[-1] and ("stopped swarm(s) cancelme" in logs[-1] or "already let go" in logs[-1])
    print(
        f"cancel -> no swarm process: {gone:.1f} s; -> Cancelled: {time.monotonic() - t0:.1f} s ({final:.1f}); "
        f"shard task runs Cancelled (+{shards:.1f} s)"
    )


def _shard_states(run_id: Any) -> list[str]:
    """States of the run's shard task runs, sorted (a cancelled shard is Cancelled, not Failed)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return sorted(t.state.type.value for t in tasks if t.name.startswith("shard-") and t.state is not None)


def test_sigkilled_flow_is_reaped(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    run, cfg = _start_long_run("killme", swarm_home, tmp_path)
    os.kill(flow_process(run.id).pid, signal.SIGKILL)
    t0 = time.monotonic()
    # the worker sees its child die and marks the run Crashed; the zombie automation covers a dead worker
    crashed = wait_for(
        lambda: _state(run.id).type.value == "CRASHED", 150, step_s=1, what="the run to be marked Crashed"
    )
    reaped = reap_orphans()  # what `prefect-swarm db prune` and the next flow run do
    wait_for(
        lambda: StateStore().get_swarm("killme").phase == "STOPPED",
        30,  # type: ignore[union-attr]
        what="record STOPPED",
    )
    wait_for(lambda: not swarm_processes(swarm_home, "killme", cfg["port"]), 30, what="swarm processes gone")
    # the crash hook (or, when no hook ran, the reaper) marks the shard task runs Crashed, not Running forever
    try:
        wait_for(lambda: _shard_states(run.id) == ["CRASHED", "CRASHED"], 30, what="shard task runs Crashed")
    except AssertionError:
        raise AssertionError(f"shard task runs: {_shard_states(run.id)}") from None
    print(f"SIGKILL -> Crashed {crashed:.0f} s; reaped by this call: {reaped}; total {time.monotonic() - t0:.0f} s")
