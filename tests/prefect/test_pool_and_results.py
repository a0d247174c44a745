"""The work pool's ``swarm_home`` and ``result_storage`` job variables, and the summary's block,
fingerprint and manifest, through the real worker."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import job_options, prompts, stub_swarm, swarm_processes
from stack import POOL_TEMPLATE, REPO, PrefectStack

from prefect_swarm.config import load_config
from prefect_swarm.state import StateStore


def test_pool_template_is_prefects_process_template_plus_swarm_variables() -> None:
    from prefect.workers.process import ProcessWorker

    ours = json.loads((REPO / POOL_TEMPLATE).read_text())
    default = ProcessWorker.get_default_base_job_template()
    assert {k: v for k, v in ours["job_configuration"].items() if k != "env"} == {
        k: v for k, v in default["job_configuration"].items() if k != "env"
    }
    assert ours["job_configuration"]["env"] == {
        "PREFECT_SWARM_HOME": "{{ swarm_home }}",
        "PREFECT_SWARM_RESULT_STORAGE": "{{ result_storage }}",
    }
    variables = ours["variables"]["properties"]
    theirs = default["variables"]["properties"]
    ours_left = {k: v for k, v in variables.items() if k not in ("swarm_home", "result_storage", "stream_output")}
    assert ours_left == {k: v for k, v in theirs.items() if k != "stream_output"}
    # one change to Prefect's variables: stream_output off by default, so a run outlives its worker
    assert variables["stream_output"]["default"] is False and theirs["stream_output"]["default"] is True
    assert {k: v for k, v in variables["stream_output"].items() if k not in ("default", "description")} == {
        k: v for k, v in theirs["stream_output"].items() if k not in ("default", "description")
    }
    # no defaults: unset, the worker's own environment applies (a None would unset it)
    assert "default" not in variables["swarm_home"] and "default" not in variables["result_storage"]


def test_a_bad_result_storage_slug_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_swarm.exceptions import ConfigError
    from prefect_swarm.tasks._common import flow_result_storage, results_dir

    assert flow_result_storage() == results_dir()
    monkeypatch.setenv("PREFECT_SWARM_RESULT_STORAGE", "local-file-system/elsewhere")
    assert flow_result_storage() == "local-file-system/elsewhere"
    monkeypatch.setenv("PREFECT_SWARM_RESULT_STORAGE", "/tmp/results")
    with pytest.raises(ConfigError, match="PREFECT_SWARM_RESULT_STORAGE"):
        flow_result_storage()


def _artifacts(run_id: Any) -> dict[str, Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return {
        a.key: json.loads(a.data) if isinstance(a.data, str) else a.data for a in arts if a.key and a.type == "table"
    }


@pytest.mark.prefect_server
@pytest.mark.slow
def test_pool_variables_set_swarm_home_and_result_storage(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    """job_variables={"swarm_home": ..., "result_storage": "local-file-system/..."} only (no env):
    the run keeps its state in that home, persists its result in that block, and its summary names
    the SwarmSpec block, the config fingerprint and the output's size and sha256."""
    from prefect.deployments import run_deployment
    from prefect.filesystems import LocalFileSystem

    from prefect_swarm.blocks import SwarmSpec

    home, results = tmp_path / "pool-home", tmp_path / "results-elsewhere"
    LocalFileSystem(basepath=str(results)).save("swarm-results-elsewhere", overwrite=True)
    cfg = load_config(data=stub_swarm("pooled"), use_defaults_file=False)
    SwarmSpec.from_config(cfg).save("pooled", overwrite=True)
    out = tmp_path / "pooled.parquet"
    run = run_deployment(
        "batch-inference/on-demand",
        timeout=240,
        job_variables={"swarm_home": str(home), "result_storage": "local-file-system/swarm-results-elsewhere"},
        parameters={
            "swarm": "swarm-spec/pooled",
            "job": job_options(),
            "input": str(prompts(tmp_path / "in.parquet", 20)),
            "output": str(out),
            "shards": 2,
        },
    )
    assert run.state is not None and run.state.is_completed(), run.state
    # swarm_home: the run's state database is there, not in the worker's PREFECT_SWARM_HOME
    rec = StateStore(home / "state.db").require_swarm("pooled")
    assert rec.phase == "STOPPED" and rec.flow_run_id == str(run.id)
    assert StateStore(prefect_stack.swarm_home / "state.db").get_swarm("pooled") is None
    assert not swarm_processes(home, "pooled", cfg.port)
    # result_storage: the flow's result is persisted in the block, and reads back
    assert any(p.is_file() for p in results.rglob("*")), "no result file in the result storage block's folder"
    assert run.state.result()["ok"] == 20  # type: ignore[index]
    # the summary: block, fingerprint; the manifest table: the output's rows, bytes and sha256
    arts = _artifacts(run.id)
    (summary,) = arts["pooled-pooled-summary"]
    assert summary["block"] == "swarm-spec/pooled" and summary["fingerprint"] == rec.fingerprint
    files = {row["file"]: row for row in arts["pooled-pooled-manifest"]}
    assert files["output"]["path"] == str(out) and files["output"]["rows"] == 20
    assert files["output"]["bytes"] == out.stat().st_size
    assert files["output"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert files["failed rows"]["rows"] == 0
