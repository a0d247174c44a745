"""A model's swarm is brought up on demand, shared by the concurrent batches of that model (whatever
tenant sent them), and let go once no batch has needed it for ``idle_release_s``."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from service_kit import chat_line, jsonl, lines_of, wait_batch

from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

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
    wait_until(  # written by the swarm's stop
        "the idle swarm let go (STOPPED)",
        lambda: state.require_swarm("svc-shared").phase,
        until=lambda phase: phase is ServingPhase.STOPPED,
        timeout_s=60,
    )


def test_queued_batches_start_one_at_a_time_in_fair_order(service_factory, tmp_path: Path) -> None:
    """max_running_batches 1: alice's three batches and then bob's one run one after another, and
    bob's starts second (the tenant with none running goes next), not last."""
    cfg = stub_swarm_config("svc-fair", latency_s=0.05, startup_delay_s=8)  # all four are queued before it is up
    svc = service_factory({"stub-model": cfg}, max_running_batches=1)
    alice, bob = svc.client(svc.key("alice")), svc.client(svc.key("bob"))

    def create(client, name: str) -> str:  # type: ignore[no-untyped-def]
        src = jsonl(tmp_path / f"{name}.jsonl", [chat_line(f"{name}-{i}") for i in range(10)])
        upload = client.files.create(file=src.open("rb"), purpose="batch")
        return client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id

    made = [(alice, create(alice, f"a{i}")) for i in range(3)] + [(bob, create(bob, "b0"))]
    done = {bid: wait_batch(client, bid) for client, bid in made}
    assert {b.status for b in done.values()} == {"completed"}
    state = StateStore(svc.home / "state.db")  # a batch's job has its id; created when the batch started
    started = sorted(done, key=lambda bid: state.require_job(bid).created_at)
    assert max(b.created_at for b in done.values()) <= state.require_job(started[0]).created_at  # all queued
    assert started[:2] == [made[0][1], made[3][1]]  # alice's first, then bob's, then alice's others
    for before, after in itertools.pairwise(started):
        assert state.require_job(after).created_at >= done[before].completed_at  # one at a time
