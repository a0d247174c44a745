"""The two-stage pipeline (examples/judge_pipeline.py: generate with one model, judge with another,
keep the rows the judge passes) on two local stub swarms, through the real worker (the shipped
``pipeline/on-demand`` deployment with the example's stages).

One run is SIGKILLed while stage 2 runs (its flow process and stage 2's job process): the task runs'
timeline shows the judge's swarm brought up only after stage 1's shards ended and its swarm was let
go; the worker's crash hook stops the judge and ends the stage's run. The same run again completes:
stage 1 sends nothing and brings no swarm up, stage 2 sends only the rows its ledger lacked (counted
at the judge's stub), and the output holds exactly the rows the judge passed.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow.parquet as pq
import pytest
from helpers import flow_process, prompts, stub_swarm, swarm_processes
from stack import REPO, PrefectStack, job_variables

from prefect_swarm.flows.pipeline import pipeline_id
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.jobs.checkpoint.ledger import read_ledger
from prefect_swarm.paths import PipelinePaths, ShardPaths, read_json
from prefect_swarm.state import StateStore
from prefect_swarm.testing.ports import free_port_block
from prefect_swarm.testing.waiting import wait_until


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


def _stage2_progress(swarm_home: Path, swarm: str) -> int:
    """Rows stage 2's running shards say they have checkpointed (their progress files: a live job
    compacts its part files, so one listed may be gone when it is read). It can lag the ledger."""
    progress = (swarm_home / "swarms" / swarm / "jobs").rglob("progress.json")
    # "checkpointed": rows in the ledger's parts ("done" also counts rows answered since the last checkpoint)
    return sum(int((d := read_json(p) or {}).get("checkpointed", d.get("done")) or 0) for p in progress)


def _stage2_ledger_rows(swarm_home: Path, swarm: str) -> int:
    """Distinct rows stage 2's ledger holds, read from its part files: call it once no job process
    of the stage runs (a part written before a kill counts even when its progress file was not)."""
    assert not _job_processes(swarm)
    shards = {p.parent for p in (swarm_home / "swarms" / swarm / "jobs").rglob("part-*.parquet")}
    tables = [read_ledger(ShardPaths(shard), ["_row"]) for shard in sorted(shards)]
    return sum(len(set(t.column("_row").to_pylist())) for t in tables if t is not None)


def _job_processes(swarm: str) -> list[psutil.Process]:
    """The job processes of swarm ``swarm`` still running."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = " ".join(proc.info.get("cmdline") or [])
        if "prefect_swarm.jobs.run" in argv and f"/swarms/{swarm}/" in argv:
            found.append(proc)
    return found


def _state(run_id: Any) -> Any:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def _logs(run_id: Any) -> list[str]:
    """The run's log lines that mention its stages or swarms (what its hooks said)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return [entry.message for entry in logs if "swarm" in entry.message or "subflow" in entry.message][-8:]


def _stub_requests(port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()["requests"])


def test_the_judge_pipeline_through_a_worker_crash_in_stage_2_and_rerun(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    """Run 1 (through the worker) is SIGKILLed while stage 2 runs: its timeline shows the judge's swarm
    brought up only after stage 1's shards ended and stage 1's swarm was let go, and the worker's crash
    hook tears down the stage's run too. Run 2, the same parameters through the worker, completes end
    to end: stage 1 sends nothing and brings no swarm up, stage 2 sends only its remaining rows."""
    from prefect.deployments import run_deployment

    n = 40
    gen_port, judge_port = free_port_block(1), free_port_block(1)
    gen, judge = stub_swarm("p-gen", port=gen_port), stub_swarm("p-judge", port=judge_port, latency_ms=150)
    judge["model"] = "stub-judge"  # another model
    plan = stages(gen, judge)
    plan[1]["job"].update(concurrency=2, checkpoint_every=4, checkpoint_seconds=0.5)  # stage 2 takes seconds
    out = tmp_path / "judged.parquet"
    params = {"stages": plan, "input": str(prompts(tmp_path / "in.parquet", n)), "output": str(out)}
    jv = job_variables(swarm_home)

    killed = run_deployment("pipeline/on-demand", parameters=params, job_variables=jv, timeout=0)
    wait_until("stage 2 to checkpoint rows", lambda: _stage2_progress(swarm_home, "p-judge") >= 8, timeout_s=240)
    os.kill(flow_process(killed.id).pid, signal.SIGKILL)  # the flow process and its stage-2 job: gone at once
    for job in _job_processes("p-judge"):
        job.kill()
    wait_until("the run marked Crashed", lambda: _state(killed.id).type.value == "CRASHED", timeout_s=120, poll_s=1)
    store = StateStore()
    wait_until(
        "judge swarm stopped", lambda: store.require_swarm("p-judge").phase is ServingPhase.STOPPED, timeout_s=60
    )
    stage_runs = _children(killed.id)
    stage2 = stage_runs["stage-2-judge"].id  # the crash hook ends the stage's run too (it died in that process)
    try:
        wait_until("stage 2's run Crashed", lambda: _state(stage2).type.value == "CRASHED", timeout_s=30)
    except AssertionError:
        raise AssertionError(f"stage 2's run is {_state(stage2).name}; the hook said: {_logs(killed.id)}") from None
    first, second = _tasks(stage_runs["stage-1-generate"].id), _tasks(stage_runs["stage-2-judge"].id)
    shards_end = max(t.end_time for t in first if t.name.startswith("shard-"))
    gen_down = next(t for t in first if t.name == "swarm-down-p-gen")
    judge_up = next(t for t in second if t.name == "swarm-up-p-judge")
    assert judge_up.start_time is not None and gen_down.end_time is not None
    assert shards_end <= gen_down.end_time <= judge_up.start_time, (shards_end, gen_down.end_time, judge_up.start_time)
    assert not any(t.name.startswith("swarm-up") for t in _tasks(killed.id)), "a swarm came up outside its stage"
    gen_stopped = store.require_swarm("p-gen")
    done_before = _stage2_ledger_rows(swarm_home, "p-judge")
    assert gen_stopped.phase is ServingPhase.STOPPED and 8 <= done_before < n

    # the same run again (overlap asked: a stage passed before is not warmed), its swarms kept to ask the stub
    again = {**params, "overlap": True, "keep_swarms": True}
    run = run_deployment("pipeline/on-demand", parameters=again, job_variables=jv, timeout=240)
    assert run.state is not None and run.state.is_completed(), run.state
    try:
        # the judge's stub: one readiness completion, then only the rows stage 2's ledger lacked
        assert _stub_requests(judge_port) == 1 + (n - done_before)
        assert store.require_swarm("p-gen").updated_at == gen_stopped.updated_at, "stage 1 brought its swarm up"
    finally:
        from prefect_swarm.flows import swarm_down

        swarm_down("p-judge")
    assert not any(t.name.startswith("swarm-up") for t in _tasks(run.id))
    pid = pipeline_id(str(out), ["generate", "judge"])
    by_stage = {s["stage"]: s for s in _summary(run.id, pid)}  # the run's summary artifact: one row per stage
    assert by_stage["generate"]["cached"] == by_stage["generate"]["went_on"] == n
    assert by_stage["generate"]["tokens_this_run"] == 0
    judged = pq.read_table(PipelinePaths.for_pipeline(pid, base=swarm_home).stage_output(2, "judge")).to_pylist()
    assert sorted(r["id"] for r in judged) == [f"r{i:05d}" for i in range(n)]  # every row once
    passed = sorted(r["id"] for r in judged if r["status"] == "ok" and r["verdict"] == "pass")
    assert 0 < len(passed) < n  # the stub's verdicts differ by request
    table = pq.read_table(out)
    assert sorted(table.column("id").to_pylist()) == passed
    assert {"prompt", "generate_text", "judge_verdict", "judge_reason"} <= set(table.column_names)
    assert set(table.column("judge_verdict").to_pylist()) == {"pass"} and "status" not in table.column_names
    assert by_stage["judge"]["model"] == "stub-judge" and by_stage["judge"]["went_on"] == len(passed)
    _left_nothing(swarm_home, ("p-gen", gen_port), ("p-judge", judge_port))


def test_the_teardown_hook_finds_the_subflow_runs_a_dead_run_left_running(prefect_api: PrefectStack) -> None:
    """A crashed pipeline's hook tears down its stages' runs too: they ran in its process."""
    from prefect import flow, get_client
    from prefect.states import Running

    from prefect_swarm.flows.hooks import subflow_runs

    @flow(name="inner-stage")
    def inner() -> str:
        from prefect_swarm.tasks._common import current_flow_run_id

        return str(current_flow_run_id())

    @flow(name="outer-pipeline")
    def outer() -> str:
        return inner()

    state = outer(return_state=True)
    parent, child = state.state_details.flow_run_id, state.result()
    assert subflow_runs(str(parent)) == []  # it ended: nothing to tear down
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(child, Running(), force=True)  # what a killed process leaves
    assert subflow_runs(str(parent)) == [child]


def test_a_pipeline_is_checked_before_any_swarm_is_brought_up(tmp_path: Path) -> None:
    """Stage names, swarm configs, job options and the columns each stage names: refused up front."""
    from prefect_swarm.exceptions import ConfigError
    from prefect_swarm.flows.pipeline import Stage, plan_pipeline

    inp, out = str(prompts(tmp_path / "in.parquet", 4)), str(tmp_path / "out.parquet")
    good = [Stage.model_validate(s) for s in stages(stub_swarm("v-gen"), stub_swarm("v-judge"))]
    paths, planned = plan_pipeline(good, inp, out, None)
    assert [p.source for p in planned] == [inp, str(paths.stage_input(2, "judge"))]
    assert [p.dest for p in planned] == [str(paths.stage_input(2, "judge")), out]
    assert planned[1].options.id_column == "id"  # taken from stage 1: the ids go on with the rows
    assert planned[1].outputs == ["text", "finish_reason", "verdict", "reason", "schema_error"]

    def refused(stage_list: list[Stage], output: str = out) -> str:
        with pytest.raises(ConfigError) as err:
            plan_pipeline(stage_list, inp, output, None)
        return str(err.value)

    bad_template = good[1].model_copy(deep=True)
    bad_template.job.job_kwargs["prompt_template"] = "{prompt} {text}"  # type: ignore[union-attr]
    assert "'text' are not among the columns" in refused([good[0], bad_template])
    judge = stages(stub_swarm("v-gen"), stub_swarm("v-judge"))[1]
    bad_keep = Stage.model_validate({**judge, "keep": {"column": "judge_verdict", "equals": "pass"}})
    assert "keep.column 'judge_verdict'" in refused([good[0], bad_keep])
    assert "names must differ" in refused([good[0], good[0]])
    assert "one parquet file" in refused(good, str(tmp_path / "out/"))
    assert StateStore().list_swarms() == []
