"""The demo (``examples/demo.py``, what ``make demo`` runs) against the REAL vLLM CPU build."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import services
from stack import PrefectStack

pytestmark = [pytest.mark.vllm, pytest.mark.prefect_server, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def test_demo_runs_end_to_end(need_vllm: None, prefect_api: PrefectStack, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect_swarm.state import StateStore

    spec = importlib.util.spec_from_file_location("prefect_swarm_demo", DEMO)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    paths = ["--vllm-python", str(services.vllm_python()), "--model", str(services.tiny_model())]
    assert demo.main(["--rows", "12", "--shards", "2", "--replicas", "1", *paths]) == 0
    out = capsys.readouterr().out
    assert "rows:     12 (ok 12, failed 0" in out and "(Completed)" in out
    assert StateStore().get_swarm("demo").phase == "STOPPED"  # type: ignore[union-attr]
