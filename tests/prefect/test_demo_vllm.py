"""The demo entry point against the REAL vLLM CPU build (one replica of the tiny model)."""

from __future__ import annotations

import pytest
from stack import PrefectStack

pytestmark = [pytest.mark.vllm, pytest.mark.prefect_server, pytest.mark.slow]


def test_demo_runs_end_to_end(need_vllm: None, prefect_api: PrefectStack, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect_swarm.flows.demo import main
    from prefect_swarm.state import StateStore

    assert main(["--rows", "12", "--shards", "2", "--replicas", "1"]) == 0
    out = capsys.readouterr().out
    assert "rows:     12 (ok 12, failed 0" in out and "(Completed)" in out
    assert StateStore().get_swarm("demo").phase == "STOPPED"  # type: ignore[union-attr]
