"""What the Prefect UI shows: a block picker for ``swarm`` (and a run from a picked block), block
form labels, task runs named for what they did, one artifact collection per job, the reaper's
schedule inactive by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack, job_variables

from prefect_swarm.blocks import LeptonBackend, LocalBackend, SlurmBackend, SwarmSpec
from prefect_swarm.config import load_config


def test_block_fields_have_titles() -> None:
    spec = SwarmSpec.model_json_schema()["properties"]
    assert spec["gpus_per_replica"]["title"] == "GPUs per replica"
    assert spec["ready_timeout_s"]["title"] == "Ready timeout (s)"
    assert spec["api_key"]["title"] == "API key"
    slurm = SlurmBackend.model_json_schema()["properties"]
    assert slurm["cpus_per_replica"]["title"] == "CPUs per replica" and slurm["qos"]["title"] == "QoS"
    assert all(p.get("title") for p in LocalBackend.model_json_schema()["properties"].values())


def test_nested_config_models_have_titles_in_block_forms() -> None:
    """The engine, container, LB and mount sub-forms label their fields (and themselves) like the
    top-level fields, not with pydantic's "Health Path" / "EngineConfig"."""
    spec = SwarmSpec.model_json_schema()["definitions"]
    engine = spec["EngineConfig"]
    assert engine["title"] == "Engine"
    assert engine["properties"]["health_path"]["title"] == "Health path"
    assert engine["properties"]["startup_timeout_s"]["title"] == "Startup timeout (s)"
    assert engine["properties"]["env"]["title"] == "Environment"
    slurm = SlurmBackend.model_json_schema()["definitions"]
    assert slurm["SlurmLBConfig"]["title"] == "Slurm LB" and slurm["ContainerConfig"]["title"] == "Container"
    assert slurm["SlurmLBConfig"]["properties"]["cpus"]["title"] == "CPUs"
    assert slurm["ContainerConfig"]["properties"]["extra_args"]["title"] == "Extra args"
    lepton = LeptonBackend.model_json_schema()["definitions"]["LeptonMount"]
    assert lepton["title"] == "Lepton mount" and lepton["properties"]["mount_path"]["title"] == "Mount path"
    for block in (SwarmSpec, SlurmBackend, LeptonBackend):
        for name, definition in block.model_json_schema()["definitions"].items():
            for field, prop in definition.get("properties", {}).items():
                assert prop.get("title") and "_" not in prop["title"], (block.__name__, name, field)


def _deployment(name: str) -> Any:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(name)


@pytest.mark.prefect_server
def test_deployment_offers_a_block_picker_for_swarm(prefect_stack: PrefectStack) -> None:
    schema = _deployment("batch-inference/on-demand").parameter_openapi_schema
    refs = [s.get("$ref", "") for s in schema["properties"]["swarm"]["anyOf"]]
    assert "#/definitions/SwarmSpec" in refs, schema["properties"]["swarm"]
    assert schema["definitions"]["SwarmSpec"]["block_type_slug"] == "swarm-spec"  # what the UI's picker keys on
    for knob in ("shards", "concurrency"):  # shown in the run form; empty (the default) sizes the job from the swarm
        (number,) = [s for s in schema["properties"][knob]["anyOf"] if s.get("type") == "integer"]
        assert number["minimum"] == 1 and schema["properties"][knob].get("default") is None


@pytest.mark.prefect_server
def test_reaper_schedule_is_inactive_by_default(prefect_stack: PrefectStack) -> None:
    schedules = _deployment("reap-orphans/reaper").schedules
    assert schedules and not any(s.active for s in schedules)


@pytest.mark.prefect_server
def test_run_from_a_picked_block(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    """The run form's block picker sends ``{"$ref": {"block_document_id": ...}}``: the run loads the
    block, names its task runs for what they did and keys its artifacts ``<swarm>-<output>-...``."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment

    block_id = SwarmSpec.from_config(load_config(data=stub_swarm("picked"), use_defaults_file=False)).save(
        "picked", overwrite=True
    )
    inp = prompts(tmp_path / "in.parquet", 10)
    run = run_deployment(
        "batch-inference/on-demand",
        timeout=240,
        job_variables=job_variables(swarm_home),
        parameters={
            "swarm": {"$ref": {"block_document_id": str(block_id)}},
            "job": job_options(),
            "input": str(inp),
            "output": str(tmp_path / "answers.parquet"),
            "shards": 1,
        },
    )
    assert run.state is not None and run.state.is_completed(), run.state
    only = FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
    with get_client(sync_client=True) as client:
        names = sorted(t.name for t in client.read_task_runs(flow_run_filter=only))
        keys = sorted(a.key for a in client.read_artifacts(flow_run_filter=only) if a.key)
        result = client.read_flow_run(run.id)
    job_id = next(t.removeprefix("job:") for t in result.tags if t.startswith("job:"))
    assert {"swarm-up-picked", "wait-ready-picked", "plan-shards-picked", f"commit-output-{job_id}"} <= set(names)
    assert "swarm-down-picked" in names and "shard-0" in names, names
    assert "picked-answers-summary" in keys, keys
    print(json.dumps({"task_runs": names, "artifact_keys": keys}))
