"""Holding a swarm through its one object (:func:`~prefect_swarm.holding.default_holding`): join and
release on real local swarms of stub engines, and the Prefect layer's word registered on import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore, process_lease
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config


def test_join_and_release_through_one_holding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(tmp_path / "home"))
    cfg = SwarmConfig.model_validate(stub_swarm_config("joined"))
    store = StateStore(tmp_path / "home" / "state.db")
    said: list[str] = []
    hold = default_holding(store, say=said.append)
    first, second = Swarm(cfg, store=store), Swarm(cfg, store=store)
    try:
        assert hold.join(first, process_lease(owner="first")) is True  # brought up by this holder
        first.wait_ready()
        assert hold.join(second, process_lease(owner="second")) is False  # shared, not brought up twice
        assert second.handle == first.as_recorded().handle
        assert sorted(x.owner for x in hold.holders(cfg.name)) == ["first", "second"]

        assert [x.owner for x in hold.release(cfg.name, "first")] == ["second"]
        assert store.require_swarm(cfg.name).phase is ServingPhase.RUNNING
        assert said == [f"swarm '{cfg.name}' stays up: still held by second."]
        assert hold.release(cfg.name, "second") == []  # the last holder lets go: stopped
        assert store.require_swarm(cfg.name).phase is ServingPhase.STOPPED
        assert hold.holders(cfg.name) == []
    finally:
        first.down()


WORD = """
import sys
from prefect_swarm.holding import default_holding
import prefect_swarm.launch
before = default_holding()
import prefect_swarm.{layer}
after = default_holding()
print(before.terminal_runs is None, before.secrets is None, after.terminal_runs is not None,
      type(getattr(after.secrets, "__self__", None)).__name__, "prefect" in sys.modules)
"""


@pytest.mark.parametrize("layer", ["tasks", "cli"])
def test_the_prefect_layer_registers_its_word_on_import(layer: str) -> None:
    """Without the Prefect layer (a job process) holding judges flow runs by their processes and has
    no secrets source; importing the layer (the CLI, a flow run) gives every later holding its word,
    still without importing Prefect itself."""
    code = WORD.format(layer=layer)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "FlowRunsAndBlocks", "False"]
