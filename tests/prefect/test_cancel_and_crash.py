"""Cancel through the API and SIGKILL of the flow process: no swarm process outlives the run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import flow_process, job_options, prompts, run_logs, stub_swarm, swarm_processes
from stack import PrefectStack, job_variables

from prefect_swarm.state import StateStore
from prefect_swarm.tasks.reaper import reap_orphans
from prefect_swarm.testing.waiting import WaitTimedOut, wait_until

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

    wait_until("swarm RUNNING with shard jobs", shards_running, timeout_s=120)
    # and both shard task runs Running in Prefect (what a cancel must turn into Cancelled)
    wait_until(
        "shard task runs Running", lambda: _shard_states(run.id), until=lambda s: s == ["RUNNING"] * 2, timeout_s=60
    )
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
    wait_until(
        "every swarm process to exit", lambda: not swarm_processes(swarm_home, "cancelme", cfg["port"]), timeout_s=30
    )
    gone = time.monotonic() - t0
    store = StateStore()  # the record follows the processes (killed first, then recorded STOPPED)
    wait_until(
        "record STOPPED", lambda: store.require_swarm("cancelme").phase, until=lambda p: p == "STOPPED", timeout_s=15
    )
    # the worker kills the flow process (TERM; the shards cancel their jobs and report Cancelled, up to
    # ~25 s on a loaded machine; KILL after 30 s), then runs the hooks and sets Cancelled
    t1 = time.monotonic()
    try:
        state = wait_until("the run to end", lambda: _state(run.id), until=lambda st: st.is_final(), timeout_s=90)
    except WaitTimedOut as exc:
        logs = run_logs(run.id)[-8:]
        raise AssertionError(f"{exc}\nrun logs: {logs}\nworker log: {_worker_log(prefect_stack)}") from None
    final = time.monotonic() - t1
    assert state.type.value == "CANCELLED", state
    t2 = time.monotonic()
    wait_until("shards Cancelled", lambda: _shard_states(run.id), until=lambda s: s == ["CANCELLED"] * 2, timeout_s=30)
    shards = time.monotonic() - t2
    # the run's lines say what happened: no "Finished in state Running()", the last line is its real
    # state, and the teardown names what it stopped (or that the run had let go of everything itself)
    wait_until(
        "the hook's line",
        lambda: [x for x in run_logs(run.id) if x.startswith(f"Flow run {run.id} ended")],
        timeout_s=30,
    )
    logs = run_logs(run.id)
    assert "Finished in state Running()" not in logs, logs[-5:]
    assert logs[-1].startswith(f"Flow run {run.id} ended Cancelled: "), logs[-5:]
    assert "none" not in logs[-1] and ("stopped swarm(s) cancelme" in logs[-1] or "already let go" in logs[-1])
    print(
        f"cancel -> no swarm process: {gone:.1f} s; -> Cancelled: {time.monotonic() - t0:.1f} s ({final:.1f}); "
        f"shard task runs Cancelled (+{shards:.1f} s)"
    )


def _worker_log(stack: PrefectStack) -> str:
    """The worker's last lines (what it did to cancel the run), for a failure message."""
    log = stack.home / "worker.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else "(no worker log)"


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
    wait_until(
        "the run to be marked Crashed",
        lambda: _state(run.id).type.value,
        until=lambda t: t == "CRASHED",
        timeout_s=150,
        poll_s=1,
    )
    crashed = time.monotonic() - t0
    reaped = reap_orphans()  # what `prefect-swarm db prune` and the next flow run do
    wait_until(
        "record STOPPED",
        lambda: StateStore().require_swarm("killme").phase,
        until=lambda p: p == "STOPPED",
        timeout_s=30,
    )
    wait_until("swarm processes gone", lambda: not swarm_processes(swarm_home, "killme", cfg["port"]), timeout_s=30)
    # the crash hook (or, when no hook ran, the reaper) marks the shard task runs Crashed, not Running forever
    wait_until(
        "shard task runs Crashed", lambda: _shard_states(run.id), until=lambda s: s == ["CRASHED"] * 2, timeout_s=30
    )
    print(f"SIGKILL -> Crashed {crashed:.0f} s; reaped by this call: {reaped}; total {time.monotonic() - t0:.0f} s")
