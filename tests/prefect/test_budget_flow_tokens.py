"""A token-priced cap in flows: a batch_inference run and a pipeline stage on an external swarm (a priced
provider: 100 / 400 $ per 1M prompt / completion tokens, 600 requests a minute, 400 rows) spend at most
the cap, counted at the provider, and their final word (the run's state message, the budget-reached
event) is the spend at exit, the cap and the rows left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import job_options, prompts, read_event
from stack import PrefectStack

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

pytestmark = [pytest.mark.prefect_server]

KEY, KEY_ENV = "sk-flow-budget-key-77a1", "FLOW_BUDGET_KEY"
PRICES = {"input_usd_per_million": 100.0, "output_usd_per_million": 400.0}


def _swarm(name: str, url: str, cap: float) -> dict[str, Any]:
    backend = {"type": "external", "url": url + "/v1", "api_key_env": KEY_ENV, "requests_per_minute": 600}
    return {"name": name, "model": "tiny", "backend": {**backend, "cost": {**PRICES, "max_cost_usd": cap}}}


def _bill(stub: StubEngine, since: dict[str, int]) -> float:
    now = stub.stats()
    pt = now.get("prompt_tokens", 0) - since.get("prompt_tokens", 0)
    ct = now.get("generation_tokens", 0) - since.get("generation_tokens", 0)
    return (PRICES["input_usd_per_million"] * pt + PRICES["output_usd_per_million"] * ct) / 1e6


def test_a_flow_run_and_a_pipeline_stage_stay_within_a_token_cap(
    prefect_api: PrefectStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_swarm.flows import batch_inference, pipeline

    monkeypatch.setenv(KEY_ENV, KEY)
    n, cap = 400, 0.5
    inp = prompts(tmp_path / "in.parquet", n)
    with StubEngine(free_port(), api_key=KEY, model="tiny") as stub:
        since, first = stub.stats(), datetime.now(UTC) - timedelta(seconds=5)
        state = batch_inference(
            _swarm("ext-flow", stub.url, cap), job_options(), str(inp), str(tmp_path / "out.parquet"), return_state=True
        )
        bill = _bill(stub, since)
        print(f"flow run: ${bill:.4f} of ${cap}")
        assert state.is_failed(), state
        message = state.message or ""
        assert "budget reached: $" in message and "(max_cost_usd) at exit" in message and "rows left" in message
        assert 0 < bill <= cap, bill
        event = _event(prefect_api.api_url, "prefect-swarm.job.budget-reached", first)
        assert "at exit" in event["payload"]["message"] and "rows left" in event["payload"]["message"], event

        # a pipeline stage's own cap (tighter than its swarm's) holds the same way
        since, stage_cap = stub.stats(), 0.25
        stage = {"name": "generate", "swarm": _swarm("ext-stage", stub.url, cap), "job": job_options()}
        stage["max_cost_usd"] = stage_cap
        run = pipeline([stage], str(inp), str(tmp_path / "piped.parquet"), return_state=True)
        bill = _bill(stub, since)
        print(f"pipeline stage: ${bill:.4f} of ${stage_cap}")
        assert run.is_failed(), run
        assert 0 < bill <= stage_cap, bill


def _event(api_url: str, name: str, since: datetime) -> dict[str, Any]:
    return read_event(api_url, name, since)
