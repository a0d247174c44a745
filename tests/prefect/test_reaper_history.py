"""The reaper does nothing destructive when Prefect cannot be asked; history degrades to SQLite."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer
from stack import PrefectStack
from typer.testing import CliRunner

from prefect_swarm.cli.history import history_cmd
from prefect_swarm.exceptions import PrefectUnavailable
from prefect_swarm.state import StateStore, SwarmRecord
from prefect_swarm.tasks.flow_runs import runs_for_swarm
from prefect_swarm.tasks.reaper import reap_orphans
from prefect_swarm.testing import free_port


def _orphan(store: StateStore, name: str = "orphan", run_id: str = "6f1c7d0e-0000-4000-8000-000000000001") -> None:
    store.put_swarm(SwarmRecord(name=name, backend="local", config={}, phase="RUNNING", flow_run_id=run_id))


def _dead_api() -> object:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"})


def test_reaper_does_nothing_when_api_down() -> None:
    store = StateStore()
    _orphan(store)
    with _dead_api():  # type: ignore[attr-defined]
        t0 = time.monotonic()
        assert reap_orphans() == []
        assert time.monotonic() - t0 < 10
    assert store.get_swarm("orphan").phase == "RUNNING"  # type: ignore[union-attr]


def test_history_says_api_unreachable_in_one_line() -> None:
    _orphan(StateStore(), "hist")
    app = typer.Typer()
    app.command()(history_cmd)
    with _dead_api():  # type: ignore[attr-defined]
        res = CliRunner().invoke(app, ["hist"])
        with pytest.raises(PrefectUnavailable):
            runs_for_swarm("hist")
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("Prefect run history unavailable:") and "unreachable" in first
    assert "swarm hist: RUNNING on local" in res.output
    from prefect_swarm.cli.main import app as cli

    with _dead_api():  # type: ignore[attr-defined]
        doc = json.loads(CliRunner().invoke(cli, ["status", "hist", "-o", "json"]).stdout)
    assert doc["prefect"]["available"] is False and "unreachable" in doc["prefect"]["error"]


@pytest.mark.prefect_server
def test_reaper_spares_unknown_running_and_kept(prefect_api: PrefectStack) -> None:
    store = StateStore()
    _orphan(store, "unknown-run")  # a run id the API does not know: cannot tell -> keep
    assert reap_orphans() == []
    assert store.get_swarm("unknown-run").phase == "RUNNING"  # type: ignore[union-attr]


@pytest.mark.prefect_server
def test_history_lists_runs(prefect_api: PrefectStack, tmp_path: Path) -> None:
    from helpers import job_options, prompts, stub_swarm

    from prefect_swarm.flows import batch_inference

    inp = prompts(tmp_path / "in.parquet", 8)
    batch_inference(stub_swarm("histy"), job_options(), str(inp), str(tmp_path / "o.parquet"))
    runs = runs_for_swarm("histy")
    assert runs and runs[0]["state"] == "Completed" and runs[0]["flow"] == "batch-inference"
    assert runs[0]["duration_s"] is not None and runs[0]["start"]
    app = typer.Typer()
    app.command()(history_cmd)
    res = CliRunner().invoke(app, ["histy"])
    assert res.exit_code == 0 and "Completed" in res.output and "STOPPED" in res.output
    from prefect_swarm.cli.main import app as cli

    shown = CliRunner().invoke(cli, ["status", "histy"])  # the swarm's Prefect runs: name, start, state, id
    assert shown.exit_code == 0, shown.output
    table = shown.stdout[shown.stdout.index("Prefect runs") :]  # narrow terminal: cells wrap
    for header in ("name", "start", "state", "id"):
        assert f" {header} " in table
    first = table.splitlines()[4]
    assert runs[0]["flow_run_name"][:8] in first and "Completed" in first and runs[0]["flow_run_id"][:8] in first


@pytest.mark.prefect_server
def test_reaper_flow_stops_a_swarm_whose_holders_are_gone(prefect_api: PrefectStack) -> None:
    import dataclasses
    import subprocess
    import sys

    from helpers import stub_swarm

    from prefect_swarm.config import load_config
    from prefect_swarm.flows import reap_orphans_flow
    from prefect_swarm.state import process_lease
    from prefect_swarm.swarm import engine_fingerprint

    cfg = load_config(data=stub_swarm("held-by-dead"))
    store = StateStore()
    store.put_swarm(
        SwarmRecord(
            name=cfg.name, backend="local", config=cfg.redacted(), phase="RUNNING", fingerprint=engine_fingerprint(cfg)
        )
    )
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store.put_lease(dataclasses.replace(process_lease(), swarm=cfg.name, owner="pid:gone", pid=gone.pid))
    state = reap_orphans_flow(return_state=True)
    assert state.result() == ["held-by-dead"]
    assert store.require_swarm(cfg.name).phase == "STOPPED" and store.list_leases(cfg.name) == []
    from prefect import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert "swarm:held-by-dead" in run.tags  # `history held-by-dead` shows who stopped it
