"""Nothing lost, nothing twice: a batch on a GPU-like simulated engine (about 8 answers a second) is
cancelled, outlives its completion window, or outlives the service itself (kill -9, then a
restart): every input line comes back once, in the output file or the error file, and no request
is sent twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from service_kit import Service, chat_line, jsonl, lines_of, wait_batch

from prefect_swarm.state import StateStore
from prefect_swarm.testing import gpu_sim
from prefect_swarm.testing.stub_engine import StubEngine, stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

pytestmark = pytest.mark.slow
ROWS = 120


@pytest.fixture(scope="module")
def svc(service_factory) -> Service:
    cfg = stub_swarm_config("svc-sim", module=gpu_sim.MODULE, max_num_seqs=4, answer_tokens=32)
    return service_factory({"stub-model": cfg}, idle_release_s=600, job={"checkpoint_seconds": 1})


@pytest.fixture(scope="module")
def alice(svc: Service, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tenant, once a first batch brought the model's swarm up (its bring-up's own requests are
    then not counted as a test's)."""
    client = svc.client(svc.key("alice"))
    src = jsonl(tmp_path_factory.mktemp("warm") / "one.jsonl", [chat_line("warm")])
    upload = client.files.create(file=src.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_batch(client, batch.id).status == "completed"
    return client


def _engine(svc: Service) -> StubEngine:
    import yaml

    return StubEngine(yaml.safe_load(svc.config.read_text())["models"]["stub-model"]["port"])


def _stat(svc: Service, key: str) -> int:
    """The engine's counter: ``requests`` received, ``ok`` answered."""
    try:
        return int(_engine(svc).stats().get(key, 0))
    except Exception:  # the swarm is not up yet
        return 0


def _start(alice: Any, tmp: Path, window: str = "24h") -> tuple[Any, list[str]]:
    ids = [f"r{i}" for i in range(ROWS)]
    upload = alice.files.create(file=jsonl(tmp / "in.jsonl", [chat_line(c, max_tokens=32) for c in ids]).open("rb"),
                                purpose="batch")  # fmt: skip
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window=window)
    return batch, ids


def _every_line_once(alice: Any, batch: Any, ids: list[str], code: str | None) -> tuple[list[dict], list[dict]]:
    out, err = lines_of(alice, batch.output_file_id), lines_of(alice, batch.error_file_id)
    seen = Counter(x["custom_id"] for x in out + err)
    assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (ROWS, len(out), len(err))
    assert all(x["response"]["status_code"] == 200 for x in out)
    if code is not None:
        assert err and all(x["error"]["code"] == code and x["response"] is None for x in err)
    return out, err


def test_cancel_returns_what_was_answered(svc: Service, alice: Any, tmp_path: Path) -> None:
    before = _stat(svc, "ok")
    batch, ids = _start(alice, tmp_path)
    wait_until(
        "the engine to answer 8 of this batch",
        lambda: _stat(svc, "ok"),
        until=lambda ok: ok >= before + 8,
        timeout_s=120,
    )  # the engine has answered some of this batch
    cancelling = alice.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = wait_batch(alice, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at >= batch.cancelling_at
    out, _ = _every_line_once(alice, batch, ids, "batch_cancelled")
    assert len(out) >= 8
    with pytest.raises(Exception, match="Cannot cancel a batch with status 'cancelled'"):
        alice.batches.cancel(batch.id)


def test_expired_batch_returns_what_was_answered(svc: Service, alice: Any, tmp_path: Path) -> None:
    batch, ids = _start(alice, tmp_path, window="8s")
    batch = wait_batch(alice, batch.id)
    assert batch.status == "expired" and batch.expired_at >= batch.expires_at
    _every_line_once(alice, batch, ids, "batch_expired")


def test_service_killed_mid_batch_completes_exactly_once(svc: Service, alice: Any, tmp_path: Path) -> None:
    before, sent = _stat(svc, "ok"), _stat(svc, "requests")
    batch, ids = _start(alice, tmp_path)
    wait_until(
        "the engine to answer 8 of this batch",
        lambda: _stat(svc, "ok"),
        until=lambda ok: ok >= before + 8,
        timeout_s=120,
    )
    svc.kill()
    assert _stat(svc, "ok") < before + ROWS  # killed mid-batch
    svc.start()
    batch = wait_batch(alice, batch.id)
    assert batch.status == "completed"
    out, err = _every_line_once(alice, batch, ids, None)
    assert not err and len(out) == ROWS
    assert _stat(svc, "requests") - sent == ROWS  # no request sent twice
    assert _sends(svc, batch.id) == Counter({cid: 1 for cid in ids})
    job = StateStore(svc.home / "state.db").require_job(batch.id)  # the batch's job has the batch's id
    assert len(job.submissions) == 1  # the restart attached to the running job; nothing was started again


def test_service_killed_as_the_batch_starts_completes_exactly_once(svc: Service, alice: Any, tmp_path: Path) -> None:
    """Killed right after the batch was accepted (its job being submitted, or about to be): the
    restarted service submits it, or attaches to what was submitted; never twice."""
    sent = _stat(svc, "requests")
    batch, ids = _start(alice, tmp_path)
    svc.kill()
    svc.start()
    batch = wait_batch(alice, batch.id)
    assert batch.status == "completed"
    out, err = _every_line_once(alice, batch, ids, None)
    assert not err and len(out) == ROWS
    assert _sends(svc, batch.id) == Counter({cid: 1 for cid in ids})  # the job's own record: each line sent once
    # the engine saw the lines and, at most, the ping of the restarted service's readiness check of the swarm
    assert ROWS <= _stat(svc, "requests") - sent <= ROWS + 1
    assert len(StateStore(svc.home / "state.db").require_job(batch.id).submissions) == 1


def _sends(svc: Service, batch_id: str) -> Counter[str]:
    """Requests the batch's job sent per custom_id, from its ledger (every write of a row, its attempts)."""
    from prefect_swarm.jobs.checkpoint.ledger import read_ledger, shard_store
    from prefect_swarm.jobs.spec import JobSpec

    spec = JobSpec.model_validate(StateStore(svc.home / "state.db").require_job(batch_id).spec)
    sends: Counter[str] = Counter()
    for i in range(spec.shards):
        table = read_ledger(shard_store(spec, i), ["_id", "attempts"])
        for cid, attempts in zip(table.column("_id").to_pylist(), table.column("attempts").to_pylist(), strict=True):
            sends[cid] += attempts
    return sends
