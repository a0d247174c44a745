"""A model's swarm is brought up on demand, shared by the concurrent batches of that model (whatever
tenant sent them), and let go once no batch has needed it for ``idle_release_s``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import chat_line, jsonl, lines_of, wait_batch

from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore
from prefect_swarm.testing.stub_engine import stub_swarm_config

pytestmark = pytest.mark.slow


def test_one_swarm_shared_then_let_go_when_idle(service_factory, tmp_path: Path) -> None:
    svc = service_factory({"stub-model": stub_swarm_config("svc-shared", latency_s=0.05)}, idle_release_s=2)
    state = StateStore(svc.home / "state.db")
    assert state.get_swarm("svc-shared") is None  # nothing is up before a batch needs it
    clients = [svc.client(svc.key(t)) for t in ("alice", "bob")]
    batches = []
    for n, client in enumerate(clients):
        lines = [chat_line(f"{n}-{i}") for i in range(20)]
        upload = client.files.create(file=jsonl(tmp_path / f"{n}.jsonl", lines).open("rb"), purpose="batch")
        batches.append(
            client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        )
    done = [wait_batch(c, b.id) for c, b in zip(clients, batches, strict=True)]
    assert [b.status for b in done] == ["completed", "completed"]
    assert [len(lines_of(c, b.output_file_id)) for c, b in zip(clients, done, strict=True)] == [20, 20]
    assert [s.name for s in state.list_swarms()] == ["svc-shared"]  # one swarm served both
    jobs = [state.require_job(b.id) for b in done]
    assert {j.swarm for j in jobs} == {"svc-shared"}
    deadline = time.monotonic() + 60
    while state.require_swarm("svc-shared").phase is not ServingPhase.STOPPED:  # written by the swarm's stop
        assert time.monotonic() < deadline, "the idle swarm was not let go"
        time.sleep(0.2)
