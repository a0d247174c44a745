"""Helpers for the Prefect tests: a stub-engine swarm config and a small dataset."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until


def stub_swarm(
    name: str,
    *,
    replicas: int = 1,
    latency_ms: float = 5,
    port: int | None = None,
    engine: dict[str, Any] | None = None,
    **backend: Any,
) -> dict[str, Any]:
    """An inline swarm config: ``replicas`` stub engines on the local backend (fast health checks,
    a 10-minute wall-time limit as a safety net); ``engine`` adds stub knobs (``hold_while`` ...)."""
    backend = {"health_interval_s": 0.5, "wall_time_s": 600, **backend}
    return stub_swarm_config(
        name, replicas=replicas, port=port, backend=backend, latency_ms=latency_ms, **(engine or {})
    )


def prompts(path: Path, n: int = 40) -> Path:
    """A parquet file of ``n`` prompts with unique ids."""
    table = pa.table({"id": [f"r{i:05d}" for i in range(n)], "prompt": [f"say hello {i}" for i in range(n)]})
    pq.write_table(table, path)
    return path


def job_options(**extra: Any) -> dict[str, Any]:
    """Job options for the stub: chat over the 'prompt' column, fast checkpoints."""
    return {
        "job": "chat",
        "id_column": "id",
        "job_kwargs": {"prompt_column": "prompt"},
        "checkpoint_every": 10,
        "checkpoint_seconds": 1.0,
        **extra,
    }


def swarm_processes(swarm_home: Path, name: str, port: int, replicas: int = 1) -> list[int]:
    """PIDs of this swarm's processes: engines (by port), watchdogs and job processes (by path)."""
    import psutil

    root = str(swarm_home / "swarms" / name)
    ports = {str(port + i) for i in range(replicas)}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        joined = " ".join(argv)
        by_port = any(a == "--port" and b in ports for a, b in itertools.pairwise(argv))
        if by_port or root in joined:
            found.append(int(proc.info["pid"]))
    return found


FINAL_LINES = ("Finished in state", "Flow process stopped: the run was cancelled")
"""How a flow process's last line starts: Prefect's, or ours for a run its worker cancelled."""


def run_logs(flow_run_id: Any) -> list[str]:
    """Flow run ``flow_run_id``'s log lines (its task runs' too) in time order, once its final line
    ("Finished in state ...", logged by the flow run itself: each task run logs one of its own) has
    reached the API."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    found: list[str] = []

    def arrived() -> bool:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), sort=LogSort.TIMESTAMP_ASC
            )
        found[:] = [entry.message for entry in logs]
        return any(entry.task_run_id is None and entry.message.startswith(FINAL_LINES) for entry in logs)

    wait_until("the run's final log line", arrived, timeout_s=30)
    return found


def flow_process(run_id: Any) -> Any:
    """The process the worker started for flow run ``run_id`` (a psutil.Process): the outermost one
    whose environment carries its ``PREFECT__FLOW_RUN_ID``. The processes it starts (the flow's, the
    shards' job processes) inherit that variable, and PIDs wrap around (32768 here), so the lowest
    PID may well be a job process."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["pid", "ppid"]):
        try:
            if proc.environ().get("PREFECT__FLOW_RUN_ID") == str(run_id):
                found[proc.pid] = proc
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    outer = [proc for proc in found.values() if proc.info["ppid"] not in found]
    assert len(outer) == 1, f"flow run {run_id}: processes {sorted(found)}, outermost {[p.pid for p in outer]}"
    return outer[0]


def read_event(api_url: str, name: str, since: Any) -> dict[str, Any]:
    """The first event called ``name`` since ``since`` (a datetime) that the server has, once it has one."""
    import httpx

    body = {"filter": {"event": {"name": [name]}, "occurred": {"since": since.isoformat()}}, "limit": 10}
    found: list[dict[str, Any]] = []

    def read() -> bool:
        resp = httpx.post(api_url + "/events/filter", json=body, timeout=10)
        resp.raise_for_status()
        found[:] = resp.json()["events"]
        return bool(found)

    wait_until(f"the {name} event", read, timeout_s=30)
    return found[0]


def job_progress_artifact(flow_run_id: str) -> Any:
    """The flow run's job-level progress artifact (the shards' own say 'shard N')."""
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, FlowRunFilter

    async def read() -> list[Any]:
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(type={"any_": ["progress"]}),
                flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}),
            )

    found = [a for a in asyncio.run(read()) if a.description and " shard " not in a.description]
    assert len(found) == 1, [a.description for a in found]
    return found[0]
