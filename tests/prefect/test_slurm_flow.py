"""``batch_inference`` on the Slurm backend through a real Prefect server + process worker.

The Prefect group's stack serves these too (one server for the suite); Slurm is shared with the
Slurm group's lanes, each test holding a slot (``slurm_lock`` in tests/conftest.py).

Cancel from the API (what the UI's Cancel button does): within 30 s no job of the swarm is left in
squeue (by the ids its record holds and by its ``psw-`` names) and the record says STOPPED. A run to
the end writes every input row exactly once and leaves nothing queued.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stack import PrefectStack, job_variables

from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.state import StateStore
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from _slurmkit import unique_name

pytestmark = [pytest.mark.slurm, pytest.mark.prefect_server, pytest.mark.slow]


def slurm_stub_swarm(name: str, latency_ms: float, replicas: int = 2) -> dict[str, Any]:
    """An inline Slurm swarm of ``replicas`` stub engines, one CPU each, no GPU."""
    command = engine_command(latency_ms=latency_ms)
    return {
        "name": name,
        "model": "stub-model",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": free_port_block(replicas),
        "ready_timeout_s": 180,
        "engine": {"kind": "command", "command": command, "startup_timeout_s": 120},
        "backend": {
            "type": "slurm",
            "cpus_per_replica": 1,
            "queue_timeout_s": 120,
            "time_limit": "15:00",
            "lb_port": free_port_block(1),
        },
    }


def prompts(path: Path, n: int) -> Path:
    """A parquet file of ``n`` prompts with unique ids ``r00000``..."""
    table = pa.table({"id": [f"r{i:05d}" for i in range(n)], "prompt": [f"say hello {i}" for i in range(n)]})
    pq.write_table(table, path)
    return path


def job_options(concurrency: int) -> dict[str, Any]:
    """Chat over the 'prompt' column, fast checkpoints."""
    return {
        "job": "chat",
        "id_column": "id",
        "job_kwargs": {"prompt_column": "prompt", "sampling": {"max_tokens": 8}},
        "concurrency": concurrency,
        "checkpoint_every": 10,
        "checkpoint_seconds": 1.0,
    }


def queued(ids: list[str], names: list[str]) -> list[str]:
    """squeue ids of what is still queued, looked up by id and (separately) by name, steps included."""
    client = SlurmClient()
    found = {e.id for e in client.squeue(ids)} | {e.id for e in client.squeue(names=names)}
    for jid in ids:
        found |= set(client.steps(jid))
    return sorted(found)


def run_state(run_id: Any) -> Any:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


@pytest.fixture
def swarm_name(need_slurm: None) -> Iterator[str]:
    """A fresh swarm name; afterwards anything still queued under its ``psw-`` names is cancelled."""
    name = unique_name("fl")
    yield name
    names = [f"psw-{name}-replicas", f"psw-{name}-lb"]
    left = SlurmClient().squeue(names=names)
    if left:
        SlurmClient().scancel(sorted({e.array_job_id if e.task_id else e.raw_id for e in left}))


def start_run(swarm_home: Path, tmp_path: Path, cfg: dict[str, Any], rows: int, concurrency: int) -> Any:
    from prefect.deployments import run_deployment

    return run_deployment(
        "batch-inference/on-demand",
        timeout=0,
        job_variables=job_variables(swarm_home),
        parameters={
            "swarm": cfg,
            "job": job_options(concurrency),
            "input": str(prompts(tmp_path / "in.parquet", rows)),
            "output": str(tmp_path / "out.parquet"),
            "shards": 2,
        },
    )


def test_cancel_clears_the_slurm_queue_within_30s(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path, swarm_name: str
) -> None:
    from prefect import get_client
    from prefect.states import Cancelling

    cfg = slurm_stub_swarm(swarm_name, latency_ms=200)
    run = start_run(swarm_home, tmp_path, cfg, rows=3000, concurrency=2)  # 2 x 2 / 0.2 s: ~150 s of work
    store = StateStore()

    def shards_running() -> bool:
        rec = store.get_swarm(swarm_name)
        jobs = store.list_jobs(swarm_name)
        running = [j for j in jobs if j.status == "RUNNING"]  # one record per job, one submission per shard
        subs = (running[0].handle or {}).get("submissions", []) if len(running) == 1 else []
        return rec is not None and rec.phase == "RUNNING" and len(subs) == 2

    wait_until("swarm RUNNING with both shard steps", shards_running, timeout_s=300, poll_s=0.5)
    rec = store.get_swarm(swarm_name)
    assert rec is not None and rec.handle
    ids = [str(rec.handle["meta"][k]) for k in ("replicas_job", "lb_job")]
    names = list(rec.handle["meta"]["job_names"])
    wait_until(  # what the cancel must clear: 2 replica tasks + LB + 2 shard steps, as squeue shows them
        "2 replica tasks, the LB and 2 shard steps in squeue",
        lambda: queued(ids, names),
        until=lambda q: len(q) >= 3 + 2,
        timeout_s=60,
        poll_s=0.5,
    )

    t0 = time.monotonic()
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)  # what the UI's Cancel button does
    wait_until("every job and step of the swarm to leave squeue", lambda: not queued(ids, names), timeout_s=30)
    empty = time.monotonic() - t0
    wait_until(
        "the swarm record to say STOPPED",
        lambda: store.require_swarm(swarm_name).phase == "STOPPED",
        timeout_s=max(1.0, 30 - empty),
    )
    stopped = time.monotonic() - t0 - empty
    wait_until("the run to be final", lambda: run_state(run.id).is_final(), timeout_s=60, poll_s=0.5)
    assert run_state(run.id).type.value == "CANCELLED"
    took = time.monotonic() - t0
    final = took - empty - stopped
    print(
        f"\ncancel -> empty squeue {empty:.1f} s; -> record STOPPED +{stopped:.1f} s; "
        f"-> run Cancelled +{final:.1f} s (total {took:.1f} s)",
        file=sys.stderr,
    )


def test_flow_on_slurm_writes_every_row_exactly_once(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path, swarm_name: str
) -> None:
    n = 400
    cfg = slurm_stub_swarm(swarm_name, latency_ms=5)
    run = start_run(swarm_home, tmp_path, cfg, rows=n, concurrency=8)
    t0 = time.monotonic()
    wait_until("the run to finish", lambda: run_state(run.id).is_final(), timeout_s=420, poll_s=1)
    took = time.monotonic() - t0
    assert run_state(run.id).type.value == "COMPLETED", run_state(run.id)
    print(f"\nbatch_inference on Slurm, {n} rows, 2 shards, through the worker: {took:.1f} s", file=sys.stderr)
    ids = [str(x) for x in pq.read_table(tmp_path / "out.parquet", columns=["id"]).column("id").to_pylist()]
    assert len(ids) == n and sorted(ids) == [f"r{i:05d}" for i in range(n)]  # one row per input id
    rec = StateStore().get_swarm(swarm_name)
    assert rec is not None and rec.phase == "STOPPED" and rec.handle
    meta = rec.handle["meta"]
    assert not queued([str(meta["replicas_job"]), str(meta["lb_job"])], list(meta["job_names"]))
    assert subprocess.run(["squeue", "-h", "-n", ",".join(meta["job_names"])], capture_output=True).stdout == b""


def test_a_flow_run_spanning_a_park_and_a_restore_finishes_exactly_once(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path, swarm_name: str
) -> None:
    """Issue 42: the run's shards are steps of the swarm's allocation, so the park ends them (they flush
    and exit 75). Each shard task waits for the restore and goes on on the restored swarm, spending no
    retry; the run completes with every row once, none failed."""
    from prefect_swarm.holding import Holding
    from prefect_swarm.jobs.checkpoint.plan import job_progress
    from prefect_swarm.jobs.spec import JobSpec

    n = 900
    cfg = slurm_stub_swarm(swarm_name, latency_ms=100, replicas=1)
    run = start_run(swarm_home, tmp_path, cfg, rows=n, concurrency=3)  # 2 x 3 / 0.1 s: ~15 s of work
    store, hold = StateStore(), Holding(StateStore())

    def done_rows() -> int:
        jobs = store.list_jobs(swarm_name)
        return int(job_progress(JobSpec.model_validate(jobs[0].spec))["done"]) if len(jobs) == 1 else 0

    def both_shards_running() -> bool:
        jobs = store.list_jobs(swarm_name)
        return len(jobs) == 1 and len((jobs[0].handle or {}).get("submissions", [])) == 2 and done_rows() >= 100

    wait_until("both shard steps answering rows", both_shards_running, timeout_s=300, poll_s=0.5)
    before = store.require_swarm(swarm_name).handle
    hold.park(swarm_name, "by the test")
    assert before is not None
    meta = before["meta"]
    assert not queued([str(meta["replicas_job"]), str(meta["lb_job"])], list(meta["job_names"]))
    wait_until(
        "both shards waiting for the restore",
        lambda: run_logs(run.id).count(f"swarm '{swarm_name}' is parked: waiting for its restore"),
        until=lambda k: k >= 2,
        timeout_s=120,
        poll_s=1,
    )
    paused_at = done_rows()
    assert paused_at < n and not run_state(run.id).is_final(), run_state(run.id)
    hold.restore(swarm_name)
    wait_until("the run to finish", lambda: run_state(run.id).is_final(), timeout_s=400, poll_s=1)
    state = run_state(run.id)
    logs = run_logs(run.id)
    assert state.type.value == "COMPLETED", (state.name, state.message, logs[-6000:])
    assert logs.count("the shard resumes from its checkpoint (no retry spent)") == 2, logs[-3000:]
    assert retries_of(run.id) == 0  # a pause, not a preemption: no shard task ran twice
    table = pq.read_table(tmp_path / "out.parquet", columns=["id", "status"])
    ids = [str(x) for x in table.column("id").to_pylist()]
    assert sorted(ids) == [f"r{i:05d}" for i in range(n)]  # every row exactly once
    assert set(table.column("status").to_pylist()) == {"ok"}  # none failed
    print(f"\nflow run spanning a park on Slurm: paused at {paused_at}/{n} rows, resumed, completed", file=sys.stderr)


def run_logs(run_id: Any) -> str:
    """Every log line of flow run ``run_id`` (its tasks' too), as the API has them now."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return "\n".join(entry.message for entry in logs)


def retries_of(run_id: Any) -> int:
    """Runs beyond the first of the run's ``run-shard`` task runs (a retry counts one)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return sum(max(t.run_count - 1, 0) for t in tasks if t.name.startswith("shard-"))
