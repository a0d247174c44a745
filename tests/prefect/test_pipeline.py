"""The two-stage pipeline (examples/judge_pipeline.py: generate with one model, judge with another,
keep the rows the judge passes) on two local stub swarms.

Through the real worker (the shipped ``pipeline/on-demand`` deployment with the example's stages):
it completes, the output holds exactly the rows the judge passed, and the task runs' timeline shows
the judge's swarm brought up only after stage 1's shards ended and its swarm was let go.

A crash in stage 2 (the flow process and its job process SIGKILLed; the runs marked Crashed as the
worker and the zombie automation do) and a rerun: stage 1 sends nothing and brings no swarm up,
stage 2 sends only the rows its ledger lacked (counted at the judge's stub).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow.parquet as pq
import pytest
from helpers import prompts, stub_swarm, swarm_processes, wait_for
from stack import REPO, PrefectStack, job_variables

from prefect_swarm.flows.pipeline import pipeline_id
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.paths import PipelinePaths
from prefect_swarm.state import StateStore
from prefect_swarm.testing.ports import free_port_block


def _example() -> Any:
    """examples/judge_pipeline.py, loaded from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("judge_pipeline", REPO / "examples" / "judge_pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stages = _example().stages

pytestmark = [pytest.mark.prefect_server]


def _children(run_id: Any) -> dict[str, Any]:
    """The subflow runs of flow run ``run_id`` (its stages) by name."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    flt = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id]))
    with get_client(sync_client=True) as client:
        return {r.name: r for r in client.read_flow_runs(flow_run_filter=flt)}


def _tasks(run_id: Any) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))


def _summary(run_id: Any, pid: str) -> list[dict[str, Any]]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        (art,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{pid}-summary"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
        )
    return json.loads(art.data) if isinstance(art.data, str) else art.data  # type: ignore[no-any-return]


def _left_nothing(swarm_home: Path, *swarms: tuple[str, int]) -> None:
    store = StateStore()
    for name, port in swarms:
        assert store.require_swarm(name).phase is ServingPhase.STOPPED, name
        assert store.list_leases(name) == [], name
        assert swarm_processes(swarm_home, name, port) == [], name


def test_the_judge_pipeline_runs_through_a_worker_each_swarm_up_only_for_its_stage(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    gen_port, judge_port = free_port_block(1), free_port_block(1)
    gen, judge = stub_swarm("p-gen", port=gen_port), stub_swarm("p-judge", port=judge_port)
    judge["model"] = "stub-judge"  # another model
    out = tmp_path / "judged.parquet"
    params = {"stages": stages(gen, judge), "input": str(prompts(tmp_path / "in.parquet", 16)), "output": str(out)}
    run = run_deployment("pipeline/on-demand", parameters=params, job_variables=job_variables(swarm_home), timeout=240)
    assert run.state is not None and run.state.is_completed(), run.state

    pid = pipeline_id(str(out), ["generate", "judge"])
    by_stage = {s["stage"]: s for s in _summary(run.id, pid)}  # the run's summary artifact: one row per stage
    assert by_stage["generate"]["ok"] == by_stage["generate"]["went_on"] == 16
    work = PipelinePaths.for_pipeline(pid, base=swarm_home)
    judged = pq.read_table(work.stage_output(2, "judge")).to_pylist()
    passed = sorted(r["id"] for r in judged if r["status"] == "ok" and r["verdict"] == "pass")
    assert len(judged) == 16 and 0 < len(passed) < 16  # the stub's verdicts differ by request
    table = pq.read_table(out)
    assert sorted(table.column("id").to_pylist()) == passed == sorted(set(passed))
    assert {"prompt", "generate_text", "judge_verdict", "judge_reason"} <= set(table.column_names)
    assert set(table.column("judge_verdict").to_pylist()) == {"pass"} and "status" not in table.column_names
    assert by_stage["judge"]["model"] == "stub-judge" and by_stage["judge"]["went_on"] == len(passed)

    # the timeline: the judge's swarm comes up after stage 1's shards ended and stage 1's swarm was let go
    stage_runs = _children(run.id)
    first, second = _tasks(stage_runs["stage-1-generate"].id), _tasks(stage_runs["stage-2-judge"].id)
    shards_end = max(t.end_time for t in first if t.name.startswith("shard-"))
    gen_down = next(t for t in first if t.name == "swarm-down-p-gen")
    judge_up = next(t for t in second if t.name == "swarm-up-p-judge")
    assert judge_up.start_time is not None and gen_down.end_time is not None
    assert shards_end <= gen_down.end_time <= judge_up.start_time, (shards_end, gen_down.end_time, judge_up.start_time)
    assert not any(t.name.startswith("swarm-up") for t in _tasks(run.id)), "a swarm came up outside its stage"
    _left_nothing(swarm_home, ("p-gen", gen_port), ("p-judge", judge_port))


RUN_PIPELINE = """
import json, sys
from prefect_swarm.flows import pipeline
args = json.loads(sys.argv[1])
pipeline(**args)
"""


def _stage2_ledger_rows(swarm_home: Path) -> int:
    """Rows stage 2's ledger holds (its checkpointed part files)."""
    return sum(
        pq.read_metadata(p).num_rows for p in (swarm_home / "swarms" / "c-judge" / "jobs").rglob("part-*.parquet")
    )


def _judge_job_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = " ".join(proc.info.get("cmdline") or [])
        if "prefect_swarm.jobs.run" in argv and "c-judge" in argv:
            found.append(proc)
    return found


def _crash(runs: list[Any]) -> None:
    """What the worker (and the zombie automation, for the subflow) record for a killed flow process."""
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        for run in runs:
            client.set_flow_run_state(run.id, Crashed(message="flow process killed"), force=True)


def _running_pipeline_runs() -> list[Any]:
    """The killed stage-2 run and its pipeline run: Running as far as the API knows."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    running = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
    named = FlowRunFilterName(any_=["stage-2-judge"])
    with get_client(sync_client=True) as client:
        (stage,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=named, state=running))
        assert stage.parent_task_run_id is not None
        parent = client.read_flow_run(client.read_task_run(stage.parent_task_run_id).flow_run_id)  # type: ignore[arg-type]
    return [stage, parent]


def _stub_requests(port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()["requests"])


def test_a_rerun_after_a_crash_in_stage_2_sends_only_its_remaining_rows(
    prefect_api: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect_swarm.flows import pipeline

    n = 60
    gen_port, judge_port = free_port_block(1), free_port_block(1)
    gen, judge = stub_swarm("c-gen", port=gen_port), stub_swarm("c-judge", port=judge_port, latency_ms=150)
    judge["model"] = "stub-judge"
    plan = stages(gen, judge)
    plan[1]["job"]["concurrency"] = 2  # stage 2 takes a few seconds: the crash lands in it
    plan[1]["job"]["checkpoint_every"] = 4
    plan[1]["job"]["checkpoint_seconds"] = 0.5
    out = tmp_path / "judged.parquet"
    args = {"stages": plan, "input": str(prompts(tmp_path / "in.parquet", n)), "output": str(out)}
    env = {**os.environ, **prefect_api.env, "PREFECT_SWARM_HOME": str(swarm_home)}
    proc = subprocess.Popen([sys.executable, "-c", RUN_PIPELINE, json.dumps(args)], env=env, start_new_session=True)
    try:
        wait_for(lambda: _stage2_ledger_rows(swarm_home) >= 8, 150, what="stage 2 to checkpoint some rows")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the flow process, then its stage-2 job: the machine went down
        for job in _judge_job_processes():
            job.kill()
        proc.wait(10)
    store = StateStore()
    gen_stopped = store.require_swarm("c-gen")
    assert gen_stopped.phase is ServingPhase.STOPPED  # stage 1 had let go of its swarm
    _crash(_running_pipeline_runs())
    done_before = _stage2_ledger_rows(swarm_home)
    assert 8 <= done_before < n

    t0 = time.monotonic()
    result = pipeline(**args, keep_swarms=True)  # kept: the judge's stub stays up to be asked what it got
    try:
        # the judge's stub: one readiness completion, then only the rows stage 2's ledger lacked
        assert _stub_requests(judge_port) == 1 + (n - done_before)
        assert store.require_swarm("c-gen").updated_at == gen_stopped.updated_at, "stage 1 brought its swarm up"
    finally:
        from prefect_swarm.flows import swarm_down

        swarm_down("c-judge")
    by_stage = {s["stage"]: s for s in result["stages"]}
    assert by_stage["generate"]["cached"] == n and by_stage["generate"]["tokens_this_run"] == 0
    judged = pq.read_table(Path(result["work_dir"]) / "stage-2-judge.parquet").to_pylist()
    assert sorted(r["id"] for r in judged) == [f"r{i:05d}" for i in range(n)]  # every row once
    passed = sorted(r["id"] for r in judged if r["verdict"] == "pass")
    assert sorted(pq.read_table(out).column("id").to_pylist()) == passed and result["rows"] == len(passed)
    print(f"rerun after a crash in stage 2: {n - done_before} of {n} rows sent, {time.monotonic() - t0:.1f} s")
